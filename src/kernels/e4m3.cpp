#include "kernels/e4m3.h"

namespace slimpi {
namespace {

// Compiled for x86-64-v3 (AVX2) and the baseline, picked at load time (as the paged kernel).
#if defined(__x86_64__) && defined(__GNUC__)
#define SLIMPI_E4M3_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define SLIMPI_E4M3_CLONES
#endif

template <class Out>
[[gnu::always_inline]] inline void rows_to(const uint8_t* codes, int64_t n, int64_t Hkv, int64_t D, const float* scale,
                                           Out* out) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < Hkv; ++h) {
      const float s = scale[h];
      const uint8_t* c = codes + (r * Hkv + h) * D;
      Out* o = out + (r * Hkv + h) * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) o[d] = static_cast<Out>(e4m3_to_float(c[d]) * s);
    }
}

}  // namespace

SLIMPI_E4M3_CLONES void e4m3_rows_to_float(const uint8_t* codes, int64_t n, int64_t Hkv, int64_t D, const float* scale,
                                           float* out) {
  rows_to(codes, n, Hkv, D, scale, out);
}

SLIMPI_E4M3_CLONES void e4m3_rows_to_bf16(const uint8_t* codes, int64_t n, int64_t Hkv, int64_t D, const float* scale,
                                          c10::BFloat16* out) {
  rows_to(codes, n, Hkv, D, scale, out);
}

}  // namespace slimpi
