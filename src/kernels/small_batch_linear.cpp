#include "kernels/small_batch_linear.h"

#include "kernels/parallel_for.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/batch_invariant.h"

#include <algorithm>
#include <type_traits>

namespace slimpi {
namespace {

// (v8 values never cross a call: every helper is always_inline; the ABI note does not apply.)
#pragma GCC diagnostic ignored "-Wpsabi"
using v8 = float __attribute__((vector_size(32)));
// The exact-numerics product's 16 lanes (batch_invariant_linear): one zmm register on
// x86-64-v4, two ymm halves on -v3 (the same operations lane by lane, so the same bits).
using v16 = float __attribute__((vector_size(64)));

template <class V>
[[gnu::always_inline]] inline V load(const float* p) {
  V v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

// bf16 weights (exact numerics in a bf16 forward): the raw 16-bit patterns, widened to fp32
// in registers (a bf16 is the high half of the fp32 of the same value: exact).
using bf16_bits = uint16_t;
using u16x8 = uint16_t __attribute__((vector_size(16)));
using u16x16 = uint16_t __attribute__((vector_size(32)));
using u32x8 = uint32_t __attribute__((vector_size(32)));
using u32x16 = uint32_t __attribute__((vector_size(64)));
template <class V>
[[gnu::always_inline]] inline V load(const bf16_bits* p) {
  using Half = std::conditional_t<sizeof(V) == 32, u16x8, u16x16>;
  using Word = std::conditional_t<sizeof(V) == 32, u32x8, u32x16>;
  Half h;
  __builtin_memcpy(&h, p, sizeof h);
  const Word w = __builtin_convertvector(h, Word) << 16;
  V v;
  __builtin_memcpy(&v, &w, sizeof v);
  return v;
}
[[gnu::always_inline]] inline float widened(float w) { return w; }
[[gnu::always_inline]] inline float widened(bf16_bits w) {
  const uint32_t bits = uint32_t(w) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

// A tile's shape at most: rows of x, rows of w.
constexpr int64_t kTileRows = 8;
constexpr int kTileCols = 8;

// v, kept in a register where the target has 256-bit ones (kAvx: x86-64-v3 and up): GCC
// would otherwise fold a load that several FMAs use into each of them (a load per FMA),
// which cost ~15% at 8 rows with the weights streaming from memory.
template <bool kKeep, class V>
[[gnu::always_inline]] inline V in_register(V v) {
  if constexpr (kKeep) __asm__("" : "+v"(v));
  return v;
}

// The lanes of an accumulator summed in one fixed order.
[[gnu::always_inline]] inline float lane_sum(v8 a) {
  return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}
[[gnu::always_inline]] inline float lane_sum(v16 a) {
  v8 half;
  for (int l = 0; l < 8; ++l) half[l] = a[l] + a[l + 8];
  return lane_sum(half);
}

// The register tile: MR (<= 8) rows of x by NR rows of w, one 8-lane accumulator per
// pair, over k in [k0, k1) in steps of 8. Each step loads NR weight vectors once and
// dots them with all MR rows of x, so at M <= 8 every weight is read from memory once
// and used by every row while in a register. With `next` (the weight rows the caller
// takes after these), every line of them at the same k is prefetched into L2 meanwhile:
// the hardware prefetcher alone kept too few lines in flight for NR <= 4 streams (8 rows
// x 3 weight rows, two threads: ~19 GB/s without, ~27 GB/s with, in a microbenchmark of
// this loop). acc holds the tile's accumulators between calls ([MR][NR] of the caller's
// [M][NR]).
template <class V, class W, bool kKeep, int MR, int NR>
[[gnu::always_inline]] inline void tile(const float* x, const W* w, const W* next, V (*acc)[kTileCols],
                                        int64_t K, int64_t k0, int64_t k1) {
  constexpr int L = sizeof(V) / sizeof(float);
  V a[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) a[i][j] = acc[i][j];
  for (int64_t k = k0; k < k1; k += L) {
    if (next != nullptr && k % 16 == 0)  // one prefetch a 64-byte line
      for (int j = 0; j < NR; ++j) __builtin_prefetch(next + j * K + k, 0, 2);
    V wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = in_register<kKeep>(load<V>(w + j * K + k));
    for (int i = 0; i < MR; ++i) {
      const V xv = in_register<kKeep>(load<V>(x + i * K + k));
      for (int j = 0; j < NR; ++j) a[i][j] += xv * wv[j];
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = a[i][j];
}

// tile<mr, NR> for a run-time mr in 1..8.
template <class V, class W, bool kKeep, int NR>
[[gnu::always_inline]] inline void tile_rows(int64_t mr, const float* x, const W* w, const W* next,
                                             V (*acc)[kTileCols], int64_t K, int64_t k0, int64_t k1) {
  switch (mr) {
    case 1: return tile<V, W, kKeep, 1, NR>(x, w, next, acc, K, k0, k1);
    case 2: return tile<V, W, kKeep, 2, NR>(x, w, next, acc, K, k0, k1);
    case 3: return tile<V, W, kKeep, 3, NR>(x, w, next, acc, K, k0, k1);
    case 4: return tile<V, W, kKeep, 4, NR>(x, w, next, acc, K, k0, k1);
    case 5: return tile<V, W, kKeep, 5, NR>(x, w, next, acc, K, k0, k1);
    case 6: return tile<V, W, kKeep, 6, NR>(x, w, next, acc, K, k0, k1);
    case 7: return tile<V, W, kKeep, 7, NR>(x, w, next, acc, K, k0, k1);
    default: return tile<V, W, kKeep, 8, NR>(x, w, next, acc, K, k0, k1);
  }
}

// y[m, n..n+NR) for all M rows of x: one 8-lane accumulator per (m, n) over k in order,
// then lane_sum and the k tail in order, so every (m, n) gets the same operations
// whatever M, NR, the row groups and the chunking. Rows of x go in groups of 8; with more
// than one group, k goes in chunks of kChunk floats so that the NR weight rows' chunk,
// read from memory by the first group (which prefetches the next rows' chunk), stays in
// L1 for the others; with one group the whole of k is one chunk and the accumulators
// stay in registers. `next`: the weight rows the caller takes after these (nullptr:
// none).
constexpr int64_t kChunk = 256;

template <class V, class W, bool kFma, bool kKeep, int NR>
[[gnu::always_inline]] inline void weight_block(const float* x, const W* w, float* y, int64_t M, int64_t K,
                                                int64_t N, int64_t n, const W* next) {
  constexpr int L = sizeof(V) / sizeof(float);
  V acc[kSmallBatchLinearMaxRows][kTileCols];
  for (int64_t m = 0; m < M; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = V{};
  const int64_t K8 = K - K % L;  // (the lanes' part of k; the tail after)
  const W* wn = w + n * K;
  const int64_t chunk = M <= kTileRows ? K8 : kChunk;
  for (int64_t k0 = 0; k0 < K8; k0 += chunk) {
    const int64_t k1 = std::min(K8, k0 + chunk);
    for (int64_t m = 0; m < M; m += kTileRows)
      tile_rows<V, W, kKeep, NR>(std::min(kTileRows, M - m), x + m * K, wn, m == 0 ? next : nullptr, acc + m, K, k0, k1);
  }
  for (int64_t m = 0; m < M; ++m)
    for (int j = 0; j < NR; ++j) {
      float s = lane_sum(acc[m][j]);
      // The k tail in order, one FMA a term where the target has FMA (written out: GCC
      // would otherwise vectorise the products apart from the sums, differently per
      // target, and -v3 and -v4 would round apart).
      for (int64_t k = K8; k < K; ++k)
        s = kFma ? __builtin_fmaf(x[m * K + k], widened(wn[j * K + k]), s) : s + x[m * K + k] * widened(wn[j * K + k]);
      y[m * N + n + j] = s;
    }
}

// Rows [n0, n1) of w against all M rows of x, in blocks of NR weight rows (as many as
// fit the registers beside the tile's rows of x), the last < NR one at a time; each block
// prefetches the next one's rows within [n0, n1).
template <class V, class W, bool kFma, bool kKeep, int NR>
[[gnu::always_inline]] inline void weight_rows_by(const float* x, const W* w, float* y, int64_t M, int64_t K,
                                                  int64_t N, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + NR <= n1; n += NR)
    weight_block<V, W, kFma, kKeep, NR>(x, w, y, M, K, N, n, n + 2 * NR <= n1 ? w + (n + NR) * K : nullptr);
  for (; n < n1; ++n) weight_block<V, W, kFma, kKeep, 1>(x, w, y, M, K, N, n, nullptr);
}

// The tile's weight rows NR for its MR rows of x, so that MR x NR accumulators, NR
// weights and one x fit kRegisters vector registers (32 of 8 floats on x86-64-v4, 16 on
// -v3; 8 of 16 floats on -v3 for the exact product's v16; measured on -v4 only). V: the
// accumulators' lanes; kFma: the target fuses multiply-adds; kKeep: V fits one register.
template <class V, class W, bool kFma, bool kKeep, int kRegisters>
[[gnu::always_inline]] inline void weight_rows(const float* x, const W* w, float* y, int64_t M, int64_t K,
                                               int64_t N, int64_t n0, int64_t n1) {
  const int64_t mr = std::min(M, kTileRows);
  if constexpr (kRegisters >= 32) {
    if (mr <= 2) return weight_rows_by<V, W, kFma, kKeep, 8>(x, w, y, M, K, N, n0, n1);  // 16 + 8 + 1
    if (mr <= 6) return weight_rows_by<V, W, kFma, kKeep, 4>(x, w, y, M, K, N, n0, n1);  // 24 + 4 + 1
    return weight_rows_by<V, W, kFma, kKeep, 3>(x, w, y, M, K, N, n0, n1);              // 24 + 3 + 1
  } else if constexpr (kRegisters >= 16) {
    if (mr <= 2) return weight_rows_by<V, W, kFma, kKeep, 4>(x, w, y, M, K, N, n0, n1);  // 8 + 4 + 1
    if (mr <= 6) return weight_rows_by<V, W, kFma, kKeep, 2>(x, w, y, M, K, N, n0, n1);  // 12 + 2 + 1
    return weight_rows_by<V, W, kFma, kKeep, 1>(x, w, y, M, K, N, n0, n1);              // 8 + 1 + 1
  } else {
    if (mr <= 2) return weight_rows_by<V, W, kFma, kKeep, 2>(x, w, y, M, K, N, n0, n1);  // 4 + 2 + 1
    return weight_rows_by<V, W, kFma, kKeep, 1>(x, w, y, M, K, N, n0, n1);
  }
}

// The kernel compiled for x86-64-v4, -v3 (FMA) and plain x86-64, picked once by the CPU.
using WeightRowsFn = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t);
__attribute__((target("arch=x86-64-v4"))) void weight_rows_v4(const float* x, const float* w, float* y, int64_t M,
                                                               int64_t K, int64_t N, int64_t n0, int64_t n1) {
  weight_rows<v8, float, true, true, 32>(x, w, y, M, K, N, n0, n1);
}
__attribute__((target("arch=x86-64-v3"))) void weight_rows_v3(const float* x, const float* w, float* y, int64_t M,
                                                               int64_t K, int64_t N, int64_t n0, int64_t n1) {
  weight_rows<v8, float, true, true, 16>(x, w, y, M, K, N, n0, n1);
}
void weight_rows_x86_64(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N, int64_t n0,
                        int64_t n1) {
  weight_rows<v8, float, false, false, 16>(x, w, y, M, K, N, n0, n1);
}

// One kernel's code per x86-64 level, and which runs: `code`, or the best this CPU has
// (exact_kernel_level, kernels/batch_invariant.h: the one CPU probe of the kernels).
template <class Fn>
struct LevelCode {
  Fn v4, v3, x86_64;
  const char* kernel;  // for the message
};
template <class Fn>
Fn code_for(const LevelCode<Fn>& c, SmallBatchLinearCode code) {
  const int level = exact_kernel_level();
  switch (code) {
    case SmallBatchLinearCode::X86_64_V4:
      SLIMPI_CHECK(level >= 4, "{}: this CPU cannot run x86-64-v4 code", c.kernel);
      return c.v4;
    case SmallBatchLinearCode::X86_64_V3:
      SLIMPI_CHECK(level >= 3, "{}: this CPU cannot run x86-64-v3 code", c.kernel);
      return c.v3;
    case SmallBatchLinearCode::X86_64: return c.x86_64;
    case SmallBatchLinearCode::Best: break;
  }
  return level >= 4 ? c.v4 : level >= 3 ? c.v3 : c.x86_64;
}
WeightRowsFn weight_rows_for(SmallBatchLinearCode code) {
  return code_for<WeightRowsFn>({weight_rows_v4, weight_rows_v3, weight_rows_x86_64, "small_batch_linear"}, code);
}

// The exact-numerics product (batch_invariant_linear): the same tiles over 16 lanes, so
// a large batch runs 512-bit FMAs on x86-64-v4; -v3 runs each v16 as two 256-bit halves,
// the same operations lane by lane (the same bits as -v4: tested); plain x86-64 rounds
// each product apart.
__attribute__((target("arch=x86-64-v4"))) void exact_rows_v4(const float* x, const float* w, float* y, int64_t M,
                                                              int64_t K, int64_t N, int64_t n0, int64_t n1) {
  weight_rows<v16, float, true, true, 32>(x, w, y, M, K, N, n0, n1);
}
__attribute__((target("arch=x86-64-v3"))) void exact_rows_v3(const float* x, const float* w, float* y, int64_t M,
                                                              int64_t K, int64_t N, int64_t n0, int64_t n1) {
  weight_rows<v16, float, true, false, 8>(x, w, y, M, K, N, n0, n1);
}
void exact_rows_x86_64(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N, int64_t n0,
                       int64_t n1) {
  weight_rows<v16, float, false, false, 8>(x, w, y, M, K, N, n0, n1);
}
WeightRowsFn exact_rows_for(SmallBatchLinearCode code) {
  return code_for<WeightRowsFn>({exact_rows_v4, exact_rows_v3, exact_rows_x86_64, "batch_invariant_linear"}, code);
}

// The same 16-lane product over bf16 weights (a bf16 forward's), each widened to fp32 in
// registers as it is loaded: the bits of the fp32 kernel on the widened weights, reading
// half the bytes. 16 lanes at every K (one order for every bf16 weight).
using Bf16RowsFn = void (*)(const float*, const bf16_bits*, float*, int64_t, int64_t, int64_t, int64_t, int64_t);
__attribute__((target("arch=x86-64-v4"))) void exact_bf16_rows_v4(const float* x, const bf16_bits* w, float* y,
                                                                   int64_t M, int64_t K, int64_t N, int64_t n0,
                                                                   int64_t n1) {
  weight_rows<v16, bf16_bits, true, true, 32>(x, w, y, M, K, N, n0, n1);
}
__attribute__((target("arch=x86-64-v3"))) void exact_bf16_rows_v3(const float* x, const bf16_bits* w, float* y,
                                                                   int64_t M, int64_t K, int64_t N, int64_t n0,
                                                                   int64_t n1) {
  weight_rows<v16, bf16_bits, true, false, 8>(x, w, y, M, K, N, n0, n1);
}
void exact_bf16_rows_x86_64(const float* x, const bf16_bits* w, float* y, int64_t M, int64_t K, int64_t N, int64_t n0,
                            int64_t n1) {
  weight_rows<v16, bf16_bits, false, false, 8>(x, w, y, M, K, N, n0, n1);
}
Bf16RowsFn exact_bf16_rows_for(SmallBatchLinearCode code) {
  return code_for<Bf16RowsFn>({exact_bf16_rows_v4, exact_bf16_rows_v3, exact_bf16_rows_x86_64, "batch_invariant_linear"},
                              code);
}

thread_local bool small_batch_scope = false;

}  // namespace

SmallBatchLinearScope::SmallBatchLinearScope() : previous_(small_batch_scope) { small_batch_scope = true; }
SmallBatchLinearScope::~SmallBatchLinearScope() { small_batch_scope = previous_; }

bool small_batch_linear_applies(const at::Tensor& x, const at::Tensor& w) {
  if (!x.defined() || !w.defined() || x.dim() < 1 || w.dim() != 2) return false;
  if (x.is_cuda() || w.is_cuda() || x.scalar_type() != at::kFloat || w.scalar_type() != at::kFloat) return false;
  if (!w.is_contiguous() || x.size(-1) != w.size(1)) return false;
  if (at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad())) return false;
  const int64_t rows = x.size(-1) == 0 ? 0 : x.numel() / x.size(-1);
  const bool large_weight = w.numel() * int64_t(sizeof(float)) >= kSmallBatchLinearLargeWeight;
  return rows >= 1 && rows <= (large_weight ? kSmallBatchLinearMaxRows : kSmallBatchLinearFewRows);
}

at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                              SmallBatchLinearCode code) {
  const int64_t K = w.size(1), N = w.size(0);
  const at::Tensor xc = x.reshape({-1, K}).contiguous();  // [M, K]
  const int64_t M = xc.size(0);
  SLIMPI_CHECK(M >= 1 && M <= kSmallBatchLinearMaxRows, "small_batch_linear: {} rows (1..{})", M,
               kSmallBatchLinearMaxRows);
  static const WeightRowsFn best = weight_rows_for(SmallBatchLinearCode::Best);
  const WeightRowsFn weight_rows_fn = code == SmallBatchLinearCode::Best ? best : weight_rows_for(code);
  at::Tensor y = at::empty({M, N}, x.options());  // [M, N]
  const float* xp = xc.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // Tasks of whole 24-row blocks (a multiple of every tile's weight rows, 8, 4, 3, 2 and
  // 1), 3 blocks a task at least but the last (a task's start-up is then small against
  // reading 72 rows of K).
  constexpr int64_t kBlock = 24;
  at::parallel_for(0, (N + kBlock - 1) / kBlock, 3, [&](int64_t b0, int64_t b1) {
    weight_rows_fn(xp, wp, yp, M, K, N, kBlock * b0, std::min(N, kBlock * b1));
  });
  if (bias.defined()) y.add_(bias);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  return y.view(shape);
}

at::Tensor batch_invariant_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                                  SmallBatchLinearCode code) {
  const bool float_operands = x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16;
  SLIMPI_CHECK(x.is_cpu() && w.is_cpu() && float_operands &&
                   (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16) && w.dim() == 2 &&
                   x.size(-1) == w.size(1),
               "batch_invariant_linear: fp32 or bf16 host x [..., {}] and w [N, K] expected, got x {} and w {} {}",
               w.dim() == 2 ? w.size(1) : -1, c10::toString(x.scalar_type()), c10::toString(w.scalar_type()),
               c10::str(w.sizes()));
  const int64_t K = w.size(1), N = w.size(0);
  const at::Tensor xc = x.reshape({-1, K}).to(at::kFloat).contiguous();  // [M, K] (bf16 widened: exact)
  const at::Tensor wc = w.contiguous();
  const int64_t M = xc.size(0);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  if (M == 0) return at::zeros(shape, xc.options());
  at::Tensor y = at::empty({M, N}, xc.options());  // [M, N]
  const float* xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // Row blocks of kSmallBatchLinearMaxRows, each against every weight row: a task per
  // (row block, 24 weight rows). Every y[m, n] is the same dot product whichever task
  // computes it (small_batch_linear.h).
  constexpr int64_t kBlock = 24;
  const int64_t row_blocks = (M + kSmallBatchLinearMaxRows - 1) / kSmallBatchLinearMaxRows;
  const int64_t col_blocks = (N + kBlock - 1) / kBlock;
  auto run_tasks = [&](auto rows_fn, const auto* wp) {
    at::parallel_for(0, row_blocks * col_blocks, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t rb = t / col_blocks, cb = t % col_blocks;
        const int64_t m0 = rb * kSmallBatchLinearMaxRows, rows = std::min(kSmallBatchLinearMaxRows, M - m0);
        rows_fn(xp + m0 * K, wp, yp + m0 * N, rows, K, N, kBlock * cb, std::min(N, kBlock * (cb + 1)));
      }
    });
  };
  if (wc.scalar_type() == at::kBFloat16) {
    static const Bf16RowsFn best_bf16 = exact_bf16_rows_for(SmallBatchLinearCode::Best);
    run_tasks(code == SmallBatchLinearCode::Best ? best_bf16 : exact_bf16_rows_for(code),
              reinterpret_cast<const bf16_bits*>(wc.data_ptr<at::BFloat16>()));
  } else {
    // 16 lanes where k is long enough for the wider FMAs to pay for the longer lane sum
    // (a property of the weight, so each weight's products keep one order whatever the rows).
    static const WeightRowsFn best_wide = exact_rows_for(SmallBatchLinearCode::Best);
    static const WeightRowsFn best_narrow = weight_rows_for(SmallBatchLinearCode::Best);
    const bool wide = K >= kBatchInvariantWideK;
    run_tasks(code == SmallBatchLinearCode::Best ? (wide ? best_wide : best_narrow)
              : wide                              ? exact_rows_for(code)
                                                  : weight_rows_for(code),
              wc.data_ptr<float>());
  }
  if (bias.defined()) y.add_(bias);
  return y.view(shape);
}

namespace {

// The batch-invariant product's value (fp32), at::linear's gradients in the operands'
// dtype (bf16 operands: bf16 products, as autocast's backward; the bias is added outside,
// by autograd):
//   ∂x = g · W,  ∂W = gᵀ · x
struct BatchInvariantLinear : public torch::autograd::Function<BatchInvariantLinear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
    ctx->save_for_backward({x, w});
    at::NoGradGuard no_grad;
    return batch_invariant_linear(x, w);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const int64_t K = w.size(1), N = w.size(0);
    const at::Tensor g = grads[0].reshape({-1, N}).to(w.scalar_type());  // [M, N]
    const at::Tensor dx = x.requires_grad() ? g.mm(w).view(x.sizes()).to(x.scalar_type()) : at::Tensor();
    const at::Tensor dw = w.requires_grad() ? g.t().mm(x.reshape({-1, K}).to(w.scalar_type())) : at::Tensor();
    return {dx, dw};
  }
};

}  // namespace

at::Tensor exact_dense(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, bool bf16) {
  // A bf16 forward's operands as autocast's linear uses them: rounded to bf16 (fp32
  // masters and a bf16 engine's weights alike); a no-op on bf16 tensors.
  const at::Tensor xs = bf16 ? x.to(at::kBFloat16) : x, ws = bf16 ? w.to(at::kBFloat16) : w;
  const at::Tensor bs = bf16 && bias.defined() ? bias.to(at::kBFloat16) : bias;
  const bool grad = at::GradMode::is_enabled() &&
                    (x.requires_grad() || w.requires_grad() || (bias.defined() && bias.requires_grad()));
  at::Tensor y;  // [..., N] fp32
  if (!grad) {
    y = batch_invariant_linear(xs, ws, bs.defined() ? bs.to(at::kFloat) : bs);
  } else {
    y = BatchInvariantLinear::apply(xs, ws);
    if (bs.defined()) y = y + bs;
  }
  return bf16 ? y.to(at::kBFloat16) : y;
}

at::Tensor dense(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  if (exact_numerics()) {
    const c10::DeviceType device = x.device().type();
    return exact_dense(x, w, bias,
                       at::autocast::is_autocast_enabled(device) &&
                           at::autocast::get_autocast_dtype(device) == at::kBFloat16);
  }
  if (small_batch_scope && small_batch_linear_applies(x, w)) return small_batch_linear(x, w, bias);
  return at::linear(x, w, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt);
}

}  // namespace slimpi
