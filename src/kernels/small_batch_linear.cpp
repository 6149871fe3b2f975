#include "kernels/small_batch_linear.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>

#include <algorithm>

namespace slimpi {
namespace {

// (v8 values never cross a call: every helper is always_inline; the ABI note does not apply.)
#pragma GCC diagnostic ignored "-Wpsabi"
using v8 = float __attribute__((vector_size(32)));

[[gnu::always_inline]] inline v8 load8(const float* p) {
  v8 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

// The lanes of an accumulator summed in one fixed order.
[[gnu::always_inline]] inline float lane_sum(v8 a) {
  return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

// Accumulates k in [k0, k1) (steps of 8) into acc[i][j] for MR rows of x (from m) and NR
// rows of w (from n), the accumulators held in registers over the chunk.
template <int MR, int NR>
[[gnu::always_inline]] inline void accumulate(const float* x, const float* w, v8 (*acc)[8], int64_t K, int64_t m,
                                              int64_t n, int64_t k0, int64_t k1) {
  v8 a[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) a[i][j] = acc[m + i][j];
  for (int64_t k = k0; k < k1; k += 8) {
    v8 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = load8(w + (n + j) * K + k);
    for (int i = 0; i < MR; ++i) {
      const v8 xv = load8(x + (m + i) * K + k);
      for (int j = 0; j < NR; ++j) a[i][j] += xv * wv[j];
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[m + i][j] = a[i][j];
}

// y[m, n] for all M rows of x and NR rows of w from n: one 8-lane accumulator per (m, n)
// over k in order (in chunks of kChunk floats, so that the NR weight rows' chunk and the
// M rows' chunk of x stay in L1 while every row of x passes), then lane_sum and the k
// tail in order. Every (m, n) gets the same operations whatever M, NR and the chunking.
constexpr int64_t kChunk = 256;

template <int NR>
[[gnu::always_inline]] inline void weight_block(const float* x, const float* w, float* y, int64_t M, int64_t K,
                                                int64_t N, int64_t n) {
  v8 acc[kSmallBatchLinearMaxRows][8] = {};
  const int64_t K8 = K - K % 8;
  for (int64_t k0 = 0; k0 < K8; k0 += kChunk) {
    const int64_t k1 = std::min(K8, k0 + kChunk);
    int64_t m = 0;
    for (; m + 2 <= M; m += 2) accumulate<2, NR>(x, w, acc, K, m, n, k0, k1);
    if (m < M) accumulate<1, NR>(x, w, acc, K, m, n, k0, k1);
  }
  for (int64_t m = 0; m < M; ++m)
    for (int j = 0; j < NR; ++j) {
      float s = lane_sum(acc[m][j]);
      for (int64_t k = K8; k < K; ++k) s += x[m * K + k] * w[(n + j) * K + k];
      y[m * N + n + j] = s;
    }
}

// Rows [n0, n1) of w against all M rows of x: blocks of 8 weight rows (read from memory
// once, from cache for the other rows of x), then of 4, the last < 4 one at a time.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void weight_rows(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 8 <= n1; n += 8) weight_block<8>(x, w, y, M, K, N, n);
  for (; n + 4 <= n1; n += 4) weight_block<4>(x, w, y, M, K, N, n);
  for (; n < n1; ++n) weight_block<1>(x, w, y, M, K, N, n);
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
  return rows >= 1 && rows <= kSmallBatchLinearMaxRows;
}

at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  const int64_t K = w.size(1), N = w.size(0);
  const at::Tensor xc = x.reshape({-1, K}).contiguous();  // [M, K]
  const int64_t M = xc.size(0);
  SLIMPI_CHECK(M >= 1 && M <= kSmallBatchLinearMaxRows, "small_batch_linear: {} rows (1..{})", M,
               kSmallBatchLinearMaxRows);
  at::Tensor y = at::empty({M, N}, x.options());  // [M, N]
  const float* xp = xc.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // Tasks of whole 8-row blocks; at least 64 weight rows each (a task's start-up is then
  // small against reading 64 rows of K floats).
  at::parallel_for(0, (N + 7) / 8, 8, [&](int64_t b0, int64_t b1) {
    weight_rows(xp, wp, yp, M, K, N, 8 * b0, std::min(N, 8 * b1));
  });
  if (bias.defined()) y.add_(bias);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  return y.view(shape);
}

at::Tensor dense(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  if (small_batch_scope && small_batch_linear_applies(x, w)) return small_batch_linear(x, w, bias);
  return at::linear(x, w, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt);
}

}  // namespace slimpi
