#include "kernels/paged_attention.h"

#include "kernels/e4m3.h"
#include "kernels/parallel_for.h"

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <slimpi/error.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace slimpi {
namespace {

// A slot's row of Hkv * D cache elements as fp32: the row itself when the cache is fp32,
// else its conversion into `scratch` (in L1); e4m3 codes by bit arithmetic
// (kernels/e4m3.h, vectorised), times their head's scale.
[[gnu::always_inline]] inline const float* as_float(const float* row, int64_t, int64_t, float*, const float*) {
  return row;
}
[[gnu::always_inline]] inline const float* as_float(const c10::BFloat16* row, int64_t Hkv, int64_t D, float* scratch,
                                                    const float*) {
  const int64_t n = Hkv * D;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) scratch[i] = static_cast<float>(row[i]);
  return scratch;
}
[[gnu::always_inline]] inline const float* as_float(const c10::Float8_e4m3fn* row, int64_t Hkv, int64_t D,
                                                    float* scratch, const float* scale) {
  const uint8_t* codes = reinterpret_cast<const uint8_t*>(row);
  for (int64_t h = 0; h < Hkv; ++h) {
    const float s = scale[h];
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) scratch[h * D + d] = e4m3_to_float(codes[h * D + d]) * s;
  }
  return scratch;
}

[[gnu::always_inline]] inline float dot(const float* a, const float* b, int64_t D) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

[[gnu::always_inline]] inline void axpy(float alpha, const float* x, float* y, int64_t D) {
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) y[d] += alpha * x[d];
}

// Asks for a slot's row (n elements) a few keys before it is read: the rows of one
// block are contiguous, but blocks lie anywhere, which the hardware prefetcher cannot
// guess (measured ~10% faster at 1024-token contexts).
constexpr int64_t kAhead = 4;
template <class KV>
[[gnu::always_inline]] inline void prefetch_row(const KV* row, int64_t n) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t byte = 0; byte < n * int64_t(sizeof(KV)); byte += 64) __builtin_prefetch(p + byte);
}

// Per-thread buffers, grown on demand and reused across calls (never freed per token).
struct Scratch {
  std::vector<float> scores;   // [H, n_keys]
  std::vector<float> row;      // [Hkv, D] a bf16 slot row as fp32
  std::vector<float> inv_sum;  // [H] 1 / softmax denominator
  std::vector<float> tile;     // [H, D] one tile's weighted sum of V
};
Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

// One sequence, all heads. q: [H, D] fp32, already scaled by 1/sqrt(D); K, V: the
// cache ([n_slots, Hkv, D], so a slot's row of every kv head is Hkv * D contiguous
// elements and a block's slots are contiguous too: the loops stream through each block);
// out: [H, D]. Query head h reads kv head h / g.
template <class KV>
[[gnu::always_inline]] inline void attend_sequence(const float* q, const KV* K, const KV* V, const int64_t* slots,
                                                   int64_t n, int64_t H, int64_t Hkv, int64_t D, float* out,
                                                   const float* k_scale = nullptr, const float* v_scale = nullptr) {
  const int64_t g = H / Hkv, stride = Hkv * D;
  Scratch& scratch = thread_scratch();
  if (int64_t(scratch.scores.size()) < H * n) scratch.scores.resize(H * n);
  if (int64_t(scratch.row.size()) < stride) scratch.row.resize(stride);
  if (int64_t(scratch.inv_sum.size()) < H) scratch.inv_sum.resize(H);
  if (int64_t(scratch.tile.size()) < H * D) scratch.tile.resize(H * D);
  float* s = scratch.scores.data();  // s[h * n + t]: head h, key t
  for (int64_t t = 0; t < n; ++t) {
    if (t + kAhead < n) prefetch_row(K + slots[t + kAhead] * stride, stride);
    const float* k = as_float(K + slots[t] * stride, Hkv, D, scratch.row.data(), k_scale);  // [Hkv, D]
    for (int64_t h = 0; h < H; ++h) s[h * n + t] = dot(q + h * D, k + (h / g) * D, D);
  }
  float* inv_sum = scratch.inv_sum.data();
  for (int64_t h = 0; h < H; ++h) {
    float* sh = s + h * n;
    const float m = *std::max_element(sh, sh + n);
    double sum = 0;  // n terms of (0, 1]: summed in fp64
    for (int64_t t = 0; t < n; ++t) {
      sh[t] = std::exp(sh[t] - m);
      sum += sh[t];
    }
    inv_sum[h] = static_cast<float>(1.0 / sum);
  }
  // Σ_t p_t V_t in two levels (tiles of kTile keys summed apart, then added up): the
  // round-off grows with kTile + n / kTile terms, not n.
  constexpr int64_t kTile = 64;
  float* tile = scratch.tile.data();
  std::fill(out, out + H * D, 0.0f);
  for (int64_t t0 = 0; t0 < n; t0 += kTile) {
    std::fill(tile, tile + H * D, 0.0f);
    for (int64_t t = t0; t < std::min(n, t0 + kTile); ++t) {
      if (t + kAhead < n) prefetch_row(V + slots[t + kAhead] * stride, stride);
      const float* v = as_float(V + slots[t] * stride, Hkv, D, scratch.row.data(), v_scale);  // [Hkv, D]
      for (int64_t h = 0; h < H; ++h) axpy(s[h * n + t], v + (h / g) * D, tile + h * D, D);
    }
    axpy(1.0f, tile, out, H * D);
  }
  for (int64_t h = 0; h < H; ++h)
    for (int64_t d = 0; d < D; ++d) out[h * D + d] *= inv_sum[h];
}

// The three instantiations the entry point calls, each compiled twice (GCC function
// multi-versioning): for x86-64-v3 (AVX2 + FMA: 8-wide fused dot products) and the
// baseline, picked once at load time by the CPU the binary runs on.
#if defined(__x86_64__) && defined(__GNUC__)
#define SLIMPI_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define SLIMPI_VECTOR_CLONES
#endif
SLIMPI_VECTOR_CLONES void attend_sequence_f32(const float* q, const float* K, const float* V, const int64_t* slots,
                                              int64_t n, int64_t H, int64_t Hkv, int64_t D, float* out) {
  attend_sequence(q, K, V, slots, n, H, Hkv, D, out);
}
SLIMPI_VECTOR_CLONES void attend_sequence_bf16(const float* q, const c10::BFloat16* K, const c10::BFloat16* V,
                                               const int64_t* slots, int64_t n, int64_t H, int64_t Hkv, int64_t D,
                                               float* out) {
  attend_sequence(q, K, V, slots, n, H, Hkv, D, out);
}
SLIMPI_VECTOR_CLONES void attend_sequence_e4m3(const float* q, const c10::Float8_e4m3fn* K,
                                               const c10::Float8_e4m3fn* V, const int64_t* slots, int64_t n, int64_t H,
                                               int64_t Hkv, int64_t D, float* out, const float* k_scale,
                                               const float* v_scale) {
  attend_sequence(q, K, V, slots, n, H, Hkv, D, out, k_scale, v_scale);
}

}  // namespace

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& cache_k, const at::Tensor& cache_v,
                                  const at::Tensor& key_slots, const at::Tensor& n_keys, const at::Tensor& k_scale,
                                  const at::Tensor& v_scale) {
  SLIMPI_CHECK(q.dim() == 3 && cache_k.dim() == 3 && cache_k.sizes() == cache_v.sizes(),
               "paged_decode_attention: q [B, H, D] and cache [n_slots, Hkv, D] expected");
  SLIMPI_CHECK(q.is_cpu() && cache_k.is_cpu() && cache_v.is_cpu(), "paged_decode_attention runs on the host");
  const bool e4m3 = cache_k.scalar_type() == at::kFloat8_e4m3fn;
  SLIMPI_CHECK(cache_k.scalar_type() == cache_v.scalar_type() &&
                   (cache_k.scalar_type() == at::kFloat || cache_k.scalar_type() == at::kBFloat16 || e4m3),
               "paged_decode_attention: an fp32, bf16 or e4m3 cache");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), Hkv = cache_k.size(1);
  SLIMPI_CHECK(!e4m3 || (k_scale.defined() && v_scale.defined() && k_scale.numel() == Hkv && v_scale.numel() == Hkv &&
                         k_scale.scalar_type() == at::kFloat && v_scale.scalar_type() == at::kFloat),
               "paged_decode_attention: an e4m3 cache needs fp32 k_scale and v_scale of its {} kv heads", Hkv);
  const at::Tensor ks = e4m3 ? k_scale.contiguous() : at::Tensor(), vs = e4m3 ? v_scale.contiguous() : at::Tensor();
  SLIMPI_CHECK(Hkv > 0 && cache_k.size(2) == D && H % Hkv == 0 && key_slots.dim() == 2 && key_slots.size(0) == B &&
                   n_keys.dim() == 1 && n_keys.size(0) == B,
               "paged_decode_attention: shapes q {}, cache {}, slots {}", c10::str(q.sizes()),
               c10::str(cache_k.sizes()), c10::str(key_slots.sizes()));
  const at::Tensor qf = (q.to(at::kFloat) * (1.0 / std::sqrt(double(D)))).contiguous();  // [B, H, D]
  const at::Tensor slots = key_slots.to(at::kLong).contiguous();                         // [B, max_keys]
  const at::Tensor lens = n_keys.to(at::kLong).contiguous();                             // [B]
  const at::Tensor kc = cache_k.contiguous(), vc = cache_v.contiguous();
  at::Tensor out = at::empty({B, H, D}, qf.options());  // [B, H, D] fp32
  const float* qp = qf.data_ptr<float>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t* np = lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const int64_t max_keys = slots.size(1);
  const int64_t n_slots = kc.size(0);
  for (int64_t b = 0; b < B; ++b) {  // every slot read is checked once, before any is read
    SLIMPI_CHECK(np[b] >= 1 && np[b] <= max_keys, "paged_decode_attention: sequence {} has {} keys of {}", b, np[b],
                 max_keys);
    for (int64_t t = 0; t < np[b]; ++t)
      SLIMPI_CHECK(sp[b * max_keys + t] >= 0 && sp[b * max_keys + t] < n_slots,
                   "paged_decode_attention: sequence {} key {} at slot {} of a {}-slot cache", b, t,
                   sp[b * max_keys + t], n_slots);
  }
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      if (e4m3)
        attend_sequence_e4m3(qp + b * H * D, kc.data_ptr<c10::Float8_e4m3fn>(), vc.data_ptr<c10::Float8_e4m3fn>(),
                             sp + b * max_keys, np[b], H, Hkv, D, op + b * H * D, ks.data_ptr<float>(),
                             vs.data_ptr<float>());
      else if (kc.scalar_type() == at::kFloat)
        attend_sequence_f32(qp + b * H * D, kc.data_ptr<float>(), vc.data_ptr<float>(), sp + b * max_keys, np[b], H, Hkv,
                        D, op + b * H * D);
      else
        attend_sequence_bf16(qp + b * H * D, kc.data_ptr<c10::BFloat16>(), vc.data_ptr<c10::BFloat16>(),
                        sp + b * max_keys, np[b], H, Hkv, D, op + b * H * D);
    }
  });
  return out.to(q.scalar_type());
}

}  // namespace slimpi
