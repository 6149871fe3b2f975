#include "kernels/batch_invariant.h"

#include "kernels/e4m3.h"
#include "kernels/parallel_for.h"

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <slimpi/error.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

namespace slimpi {
namespace {

// (This file is compiled with -ffp-contract=off: src/CMakeLists.txt.)
constexpr int kLanes = 16;

// Σ_i term(i) for i in [0, n): element i into lane i mod 16 in index order, then the
// lanes in one fixed tree. Acc: the lanes' type (float or double).
template <class Acc, class Term>
[[gnu::always_inline]] inline Acc lane_sum(int64_t n, Term term) {
  Acc acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) acc[l] += Acc(term(i + l));
  }
  for (int l = 0; i < n; ++i, ++l) acc[l] += Acc(term(i));
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
  return acc[0];
}

// exp(x) in fp32 by plain arithmetic: n = floor(x·log2(e) + 1/2), r = x − n·ln2 (ln2 in
// two parts, Cody-Waite), e^r = 1 + r + r²·P(r) (Cephes' expf polynomial), times 2^n
// built in the exponent bits. Relative error ~1e-7 on [−87, 88]; 0 below −87 (and for
// −inf), NaN for NaN (a diverged model's NaN reaches the loss, as ATen's exp would pass
// it on), e^88 above 88 (softmax and log-prob callers subtract a row's max first; silu and
// sigmoid take exp(−x), where the clamp only moves results for x < −88 that are ~0 or
// below 1e-38 anyway).
[[gnu::always_inline]] inline float exp_fixed(float x) {
  const bool zero = x < -87.0f;
  const float xc = std::min(std::max(x, -87.0f), 88.0f);
  const float n_or_nan = __builtin_floorf(xc * 1.44269504088896341f + 0.5f);
  const float n = n_or_nan == n_or_nan ? n_or_nan : 0.0f;  // (NaN: a defined conversion below; p stays NaN)
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  const float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = (p * z + r) + 1.0f;
  const float scale = std::bit_cast<float>(int32_t((int32_t(n) + 127) << 23));
  return zero ? 0.0f : p * scale;
}

at::Tensor host_fp32(const at::Tensor& x, const char* what) {
  SLIMPI_CHECK(x.defined() && x.is_cpu() && x.scalar_type() == at::kFloat,
               "{}: fp32 host tensors only (exact on-policy mode runs on the CPU; model/exact_ops.h widens a bf16 "
               "forward's tensors first)",
               what);
  return x.contiguous();
}

float row_max(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// Per-thread scratch rows, grown on demand and reused.
std::vector<float>& scratch(int which, int64_t n) {
  thread_local std::vector<float> rows[2];
  if (int64_t(rows[which].size()) < n) rows[which].resize(size_t(n));
  return rows[which];
}

// The kernels' element loops, one compiled clone per level the CPU may have (all round
// alike: no contraction, the same operations in every clone).
#if defined(__x86_64__) && defined(__GNUC__)
#define SLIMPI_BI_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SLIMPI_BI_CLONES
#endif

SLIMPI_BI_CLONES void rms_norm_row(const float* x, const float* w, float* y, int64_t n, double eps) {
  const double ss = lane_sum<double>(n, [&](int64_t i) { return double(x[i]) * double(x[i]); });
  const float rho = static_cast<float>(1.0 / std::sqrt(ss / double(n) + eps));
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * rho) * w[i];
}

SLIMPI_BI_CLONES void silu_mul_span(const float* g, const float* u, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = (g[i] / (1.0f + exp_fixed(-g[i]))) * u[i];
}

SLIMPI_BI_CLONES void sigmoid_span(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = 1.0f / (1.0f + exp_fixed(-x[i]));
}

SLIMPI_BI_CLONES void silu_span(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + exp_fixed(-x[i]));
}

SLIMPI_BI_CLONES void l2_normalize_row(const float* x, float* y, int64_t n, double eps) {
  const double ss = lane_sum<double>(n, [&](int64_t i) { return double(x[i]) * double(x[i]); });
  const float rho = static_cast<float>(1.0 / std::sqrt(ss + eps));
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * rho;
}

// (Scalar: libm's log1p and exp in fp64, one call an element, the same in every clone.)
void softplus_span(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    y[i] = x[i] > 20.0f ? x[i] : static_cast<float>(std::log1p(std::exp(double(x[i]))));
}

// One sequence's and value head's gated delta rule, token by token (see
// gated_delta_rule_rows): S [Dk, Dv] in place; q, k advance by k_step floats a token, v
// and o by v_step, g and beta by gb_step.
SLIMPI_BI_CLONES void delta_rule_head(const float* q, const float* k, const float* v, const float* g,
                                      const float* beta, float* o, float* S, int64_t L, int64_t Dk, int64_t Dv,
                                      int64_t k_step, int64_t v_step, int64_t gb_step, float* kS) {
  for (int64_t t = 0; t < L; ++t) {
    const float* qt = q + t * k_step;
    const float* kt = k + t * k_step;
    const float* vt = v + t * v_step;
    const float decay = exp_fixed(g[t * gb_step]), b = beta[t * gb_step];
    for (int64_t i = 0; i < Dk; ++i) {
#pragma omp simd
      for (int64_t j = 0; j < Dv; ++j) S[i * Dv + j] = S[i * Dv + j] * decay;
    }
#pragma omp simd
    for (int64_t j = 0; j < Dv; ++j) kS[j] = 0.0f;
    for (int64_t i = 0; i < Dk; ++i) {
#pragma omp simd
      for (int64_t j = 0; j < Dv; ++j) kS[j] = kS[j] + kt[i] * S[i * Dv + j];
    }
#pragma omp simd
    for (int64_t j = 0; j < Dv; ++j) kS[j] = (vt[j] - kS[j]) * b;  // u
    for (int64_t i = 0; i < Dk; ++i) {
#pragma omp simd
      for (int64_t j = 0; j < Dv; ++j) S[i * Dv + j] = S[i * Dv + j] + kt[i] * kS[j];
    }
    float* ot = o + t * v_step;
#pragma omp simd
    for (int64_t j = 0; j < Dv; ++j) ot[j] = 0.0f;
    for (int64_t i = 0; i < Dk; ++i) {
#pragma omp simd
      for (int64_t j = 0; j < Dv; ++j) ot[j] = ot[j] + qt[i] * S[i * Dv + j];
    }
  }
}

SLIMPI_BI_CLONES void softmax_row(const float* x, float* y, int64_t n) {
  const float m = row_max(x, n);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = exp_fixed(x[i] - m);
  const float inv = static_cast<float>(1.0 / lane_sum<double>(n, [&](int64_t i) { return y[i]; }));
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] * inv;
}

// z [V] already divided by the temperature; `sorted`: a scratch row of V when k > 0.
SLIMPI_BI_CLONES double log_sum_exp_shifted(const float* z, int64_t V, float m, int64_t k, float* sorted) {
  if (k <= 0 || k >= V) return std::log(lane_sum<double>(V, [&](int64_t j) { return exp_fixed(z[j] - m); }));
  std::copy(z, z + V, sorted);
  std::partial_sort(sorted, sorted + k, sorted + V, std::greater<float>());
  return std::log(lane_sum<double>(k, [&](int64_t j) { return exp_fixed(sorted[j] - m); }));
}

SLIMPI_BI_CLONES void divide_row(const float* x, float t, float* z, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) z[j] = x[j] / t;
}

// One sequence's query rows against one kv head and its g query heads (see
// attention_rows). The sequence's keys of that head are first laid out transposed, KT[d][t]
// (so that a score row is D vectorised passes over t, each score summed over d in order);
// the values are read as fp32 rows too, VT [n_max, D]. A cache of bf16 or e4m3 (times the
// head's scale) is read as its fp32 values (kernels/e4m3.h). Every row's numbers depend on
// its query, its n keys and nothing else. rows: the query rows (indices into q and out),
// n_keys: each row's.
[[gnu::always_inline]] inline float as_fp32(float x, float) { return x; }
[[gnu::always_inline]] inline float as_fp32(c10::BFloat16 x, float) { return static_cast<float>(x); }
[[gnu::always_inline]] inline float as_fp32(c10::Float8_e4m3fn x, float scale) {
  return e4m3_to_float(std::bit_cast<uint8_t>(x)) * scale;
}

template <class KV>
[[gnu::always_inline]] inline void attention_group(const float* q, const KV* K, const KV* V, const float* k_scale,
                                                   const float* v_scale, const int64_t* slots,
                                                   const std::vector<int64_t>& rows, const int64_t* n_keys, int64_t kvh,
                                                   int64_t H, int64_t Hkv, int64_t D, float* out) {
  const int64_t g = H / Hkv, stride = Hkv * D;
  int64_t n_max = 0;
  for (int64_t r : rows) n_max = std::max(n_max, n_keys[r]);
  const float inv_sqrt_d = static_cast<float>(1.0 / std::sqrt(double(D)));
  // KT [D, n_max], VT [n_max, D], then s [n_max], qs [D], tile [D]
  float* kt = scratch(0, 2 * D * n_max + n_max + 2 * D).data();
  float* vt_rows = kt + D * n_max;
  float* s = vt_rows + D * n_max;
  float* qs = s + n_max;
  float* tile = qs + D;
  const float ks = k_scale ? k_scale[kvh] : 1.0f, vs = v_scale ? v_scale[kvh] : 1.0f;
  for (int64_t t = 0; t < n_max; ++t) {
    const KV* k = K + slots[t] * stride + kvh * D;
    const KV* v = V + slots[t] * stride + kvh * D;
    for (int64_t d = 0; d < D; ++d) kt[d * n_max + t] = as_fp32(k[d], ks);
    for (int64_t d = 0; d < D; ++d) vt_rows[t * D + d] = as_fp32(v[d], vs);
  }
  constexpr int64_t kTile = 64;
  for (int64_t r : rows) {
    const int64_t n = n_keys[r];
    for (int64_t h = kvh * g; h < (kvh + 1) * g; ++h) {
      const float* qh = q + (r * H + h) * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) qs[d] = qh[d] * inv_sqrt_d;
      std::fill(s, s + n, 0.0f);
      for (int64_t d = 0; d < D; ++d) {
        const float qd = qs[d];
        const float* kd = kt + d * n_max;
#pragma omp simd
        for (int64_t t = 0; t < n; ++t) s[t] = s[t] + qd * kd[t];
      }
      const float m = row_max(s, n);
#pragma omp simd
      for (int64_t t = 0; t < n; ++t) s[t] = exp_fixed(s[t] - m);
      const float inv = static_cast<float>(1.0 / lane_sum<double>(n, [&](int64_t t) { return s[t]; }));
      float* oh = out + (r * H + h) * D;
      std::fill(oh, oh + D, 0.0f);
      for (int64_t t0 = 0; t0 < n; t0 += kTile) {
        std::fill(tile, tile + D, 0.0f);
        for (int64_t t = t0; t < std::min(n, t0 + kTile); ++t) {
          const float p = s[t];
          const float* vt = vt_rows + t * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) tile[d] = tile[d] + p * vt[d];
        }
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) oh[d] = oh[d] + tile[d];
      }
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) oh[d] = oh[d] * inv;
    }
  }
}

// attention_group for each storage of the keys and values, one clone per CPU level.
SLIMPI_BI_CLONES void attention_group_f32(const float* q, const float* K, const float* V, const float*, const float*,
                                          const int64_t* slots, const std::vector<int64_t>& rows,
                                          const int64_t* n_keys, int64_t kvh, int64_t H, int64_t Hkv, int64_t D,
                                          float* out) {
  attention_group(q, K, V, nullptr, nullptr, slots, rows, n_keys, kvh, H, Hkv, D, out);
}
SLIMPI_BI_CLONES void attention_group_bf16(const float* q, const c10::BFloat16* K, const c10::BFloat16* V,
                                           const float*, const float*, const int64_t* slots,
                                           const std::vector<int64_t>& rows, const int64_t* n_keys, int64_t kvh,
                                           int64_t H, int64_t Hkv, int64_t D, float* out) {
  attention_group(q, K, V, nullptr, nullptr, slots, rows, n_keys, kvh, H, Hkv, D, out);
}
SLIMPI_BI_CLONES void attention_group_e4m3(const float* q, const c10::Float8_e4m3fn* K, const c10::Float8_e4m3fn* V,
                                           const float* k_scale, const float* v_scale, const int64_t* slots,
                                           const std::vector<int64_t>& rows, const int64_t* n_keys, int64_t kvh,
                                           int64_t H, int64_t Hkv, int64_t D, float* out) {
  attention_group(q, K, V, k_scale, v_scale, slots, rows, n_keys, kvh, H, Hkv, D, out);
}

std::atomic<bool> exact_on{false};

// y = span(x) over x's elements, the threads splitting them in runs of at least `grain`
// (a span's elements are independent: where a run ends does not matter).
at::Tensor map_elements(const at::Tensor& x, const char* what, int64_t grain,
                        void (*span)(const float*, float*, int64_t)) {
  const at::Tensor xc = host_fp32(x, what);
  at::Tensor y = at::empty_like(xc);
  const float* xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, xc.numel(), grain, [&](int64_t i0, int64_t i1) { span(xp + i0, yp + i0, i1 - i0); });
  return y;
}

// y[r, :] = row(x[r, :], y[r, :], n) for every row of x's last dimension (n), the threads
// splitting rows only.
template <class Row>
at::Tensor map_rows(const at::Tensor& x, const char* what, Row row) {
  const at::Tensor xc = host_fp32(x, what);
  const int64_t n = xc.size(-1), R = n == 0 ? 0 : xc.numel() / n;
  at::Tensor y = at::empty_like(xc);
  const float* xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) row(xp + r * n, yp + r * n, n);
  });
  return y;
}

}  // namespace

at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& w, double eps) {
  const at::Tensor xc = host_fp32(x, "rms_norm_rows"), wc = host_fp32(w, "rms_norm_rows");
  SLIMPI_CHECK(wc.numel() == xc.size(-1), "rms_norm_rows: a weight of {} for rows of {}", wc.numel(), xc.size(-1));
  const float* wp = wc.data_ptr<float>();
  return map_rows(xc, "rms_norm_rows", [&](const float* xr, float* yr, int64_t n) { rms_norm_row(xr, wp, yr, n, eps); });
}

at::Tensor silu_mul_elementwise(const at::Tensor& g, const at::Tensor& u) {
  const at::Tensor gc = host_fp32(g, "silu_mul"), uc = host_fp32(u, "silu_mul");
  SLIMPI_CHECK(gc.sizes() == uc.sizes(), "silu_mul: shapes {} and {}", c10::str(gc.sizes()), c10::str(uc.sizes()));
  at::Tensor y = at::empty_like(gc);
  const float *gp = gc.data_ptr<float>(), *up = uc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, gc.numel(), 1 << 14,
                   [&](int64_t i0, int64_t i1) { silu_mul_span(gp + i0, up + i0, yp + i0, i1 - i0); });
  return y;
}

at::Tensor sigmoid_elementwise(const at::Tensor& x) { return map_elements(x, "sigmoid", 1 << 14, sigmoid_span); }

at::Tensor softmax_rows(const at::Tensor& x) { return map_rows(x, "softmax_rows", softmax_row); }

at::Tensor normalize_rows(const at::Tensor& x, double eps) {
  const at::Tensor xc = host_fp32(x, "normalize_rows");
  const int64_t k = xc.size(-1), R = k == 0 ? 0 : xc.numel() / k;
  at::Tensor y = at::empty_like(xc);
  const float* xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const float e = static_cast<float>(eps);
  for (int64_t r = 0; r < R; ++r) {
    float s = 0.0f;
    for (int64_t j = 0; j < k; ++j) s = s + xp[r * k + j];
    s = s + e;
    for (int64_t j = 0; j < k; ++j) yp[r * k + j] = xp[r * k + j] / s;
  }
  return y;
}

at::Tensor token_log_probs_rows(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& targets,
                                const at::Tensor& support) {
  const at::Tensor zc = host_fp32(logits, "token_log_probs"), tc = host_fp32(temperature, "token_log_probs");
  SLIMPI_CHECK(zc.dim() == 2 && tc.numel() == zc.size(0) && targets.numel() == zc.size(0) &&
                   (!support.defined() || support.numel() == zc.size(0)),
               "token_log_probs: logits {}, {} temperatures, {} targets", c10::str(zc.sizes()), tc.numel(),
               targets.numel());
  const int64_t N = zc.size(0), V = zc.size(1);
  const at::Tensor tg = targets.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor sp = support.defined() ? support.to(at::kCPU, at::kLong).contiguous() : at::zeros({N}, at::kLong);
  const int64_t *tp = tg.data_ptr<int64_t>(), *kp = sp.data_ptr<int64_t>();
  for (int64_t r = 0; r < N; ++r)
    SLIMPI_CHECK(tp[r] >= 0 && tp[r] < V, "token_log_probs: row {} scores token {} of a {}-token vocabulary", r, tp[r], V);
  at::Tensor out = at::empty({N}, zc.options());
  const float *lp = zc.data_ptr<float>(), *temp = tc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, N, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      SLIMPI_CHECK(temp[r] > 0, "token_log_probs: row {} at temperature {}", r, temp[r]);
      float* z = scratch(0, V).data();
      divide_row(lp + r * V, temp[r], z, V);
      const float m = row_max(z, V);
      const double lse = log_sum_exp_shifted(z, V, m, kp[r], kp[r] > 0 ? scratch(1, V).data() : nullptr);
      op[r] = static_cast<float>((double(z[tp[r]]) - double(m)) - lse);
    }
  });
  return out;
}

at::Tensor attention_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_slots,
                          const at::Tensor& seq_of_row, const at::Tensor& n_keys, const at::Tensor& k_scale,
                          const at::Tensor& v_scale) {
  const at::Tensor qc = host_fp32(q, "attention_rows");
  const at::ScalarType storage = k.scalar_type();
  const bool e4m3 = storage == at::kFloat8_e4m3fn;
  SLIMPI_CHECK(k.is_cpu() && v.is_cpu() && v.scalar_type() == storage &&
                   (storage == at::kFloat || storage == at::kBFloat16 || e4m3),
               "attention_rows: host keys and values of fp32, bf16 or e4m3 (one dtype)");
  const at::Tensor kc = k.contiguous(), vc = v.contiguous();
  const at::Tensor ksc = e4m3 ? k_scale.to(at::kFloat).contiguous() : at::Tensor();
  const at::Tensor vsc = e4m3 ? v_scale.to(at::kFloat).contiguous() : at::Tensor();
  SLIMPI_CHECK(!e4m3 || (ksc.numel() == k.size(1) && vsc.numel() == k.size(1)),
               "attention_rows: an e4m3 cache needs a scale per kv head ({})", k.size(1));
  SLIMPI_CHECK(qc.dim() == 3 && kc.dim() == 3 && kc.sizes() == vc.sizes() && kc.size(2) == qc.size(2) &&
                   kc.size(1) > 0 && qc.size(1) % kc.size(1) == 0,
               "attention_rows: q {} against k/v {}", c10::str(qc.sizes()), c10::str(kc.sizes()));
  const int64_t R = qc.size(0), H = qc.size(1), D = qc.size(2), Hkv = kc.size(1), n_slots = kc.size(0);
  const at::Tensor slots = key_slots.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor seq = seq_of_row.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor lens = n_keys.to(at::kCPU, at::kLong).contiguous();
  SLIMPI_CHECK(slots.dim() == 2 && seq.numel() == R && lens.numel() == R,
               "attention_rows: slots {}, {} rows' sequences and key counts for {} rows", c10::str(slots.sizes()),
               seq.numel(), R);
  const int64_t B = slots.size(0), max_keys = slots.size(1);
  const int64_t *sp = slots.data_ptr<int64_t>(), *bp = seq.data_ptr<int64_t>(), *np = lens.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> rows_of(static_cast<size_t>(B));  // each sequence's query rows
  for (int64_t r = 0; r < R; ++r) {
    SLIMPI_CHECK(bp[r] >= 0 && bp[r] < B && np[r] >= 1 && np[r] <= max_keys,
                 "attention_rows: row {} of sequence {} (of {}) with {} keys (of {})", r, bp[r], B, np[r], max_keys);
    rows_of[size_t(bp[r])].push_back(r);
  }
  for (int64_t b = 0; b < B; ++b) {  // every slot a row reads, checked before any is read
    int64_t used = 0;
    for (int64_t r : rows_of[size_t(b)]) used = std::max(used, np[r]);
    for (int64_t t = 0; t < used; ++t)
      SLIMPI_CHECK(sp[b * max_keys + t] >= 0 && sp[b * max_keys + t] < n_slots,
                   "attention_rows: sequence {} key {} at slot {} of {}", b, t, sp[b * max_keys + t], n_slots);
  }
  at::Tensor out = at::empty({R, H, D}, qc.options());
  const float* qp = qc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  // A task per (sequence, kv head): tasks write disjoint rows and heads of out.
  at::parallel_for(0, B * Hkv, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t b = task / Hkv, kvh = task % Hkv;
      const std::vector<int64_t>& rows = rows_of[size_t(b)];
      if (rows.empty()) continue;
      const int64_t* bs = sp + b * max_keys;
      if (storage == at::kFloat)
        attention_group_f32(qp, kc.data_ptr<float>(), vc.data_ptr<float>(), nullptr, nullptr, bs, rows, np, kvh, H,
                            Hkv, D, op);
      else if (storage == at::kBFloat16)
        attention_group_bf16(qp, kc.data_ptr<c10::BFloat16>(), vc.data_ptr<c10::BFloat16>(), nullptr, nullptr, bs,
                             rows, np, kvh, H, Hkv, D, op);
      else
        attention_group_e4m3(qp, kc.data_ptr<c10::Float8_e4m3fn>(), vc.data_ptr<c10::Float8_e4m3fn>(),
                             ksc.data_ptr<float>(), vsc.data_ptr<float>(), bs, rows, np, kvh, H, Hkv, D, op);
    }
  });
  return out;
}

at::Tensor silu_elementwise(const at::Tensor& x) { return map_elements(x, "silu", 1 << 14, silu_span); }

// (a smaller grain: each element is two libm calls)
at::Tensor softplus_elementwise(const at::Tensor& x) { return map_elements(x, "softplus", 1 << 12, softplus_span); }

at::Tensor l2_normalize_rows(const at::Tensor& x, double eps) {
  return map_rows(x, "l2_normalize_rows",
                  [eps](const float* xr, float* yr, int64_t n) { l2_normalize_row(xr, yr, n, eps); });
}

at::Tensor gated_delta_rule_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                 const at::Tensor& beta, const at::Tensor& initial_state, at::Tensor* final_state) {
  const at::Tensor qc = host_fp32(q, "gated_delta_rule_rows"), kc = host_fp32(k, "gated_delta_rule_rows");
  const at::Tensor vc = host_fp32(v, "gated_delta_rule_rows"), gc = host_fp32(g, "gated_delta_rule_rows");
  const at::Tensor bc = host_fp32(beta, "gated_delta_rule_rows");
  SLIMPI_CHECK(qc.dim() == 4 && kc.sizes() == qc.sizes() && vc.dim() == 4 &&
                   vc.sizes().slice(0, 3) == qc.sizes().slice(0, 3) && gc.sizes() == qc.sizes().slice(0, 3) &&
                   bc.sizes() == gc.sizes(),
               "gated_delta_rule_rows: q/k [B, L, H, Dk], v [B, L, H, Dv], g/beta [B, L, H] expected");
  const int64_t B = qc.size(0), L = qc.size(1), H = qc.size(2), Dk = qc.size(3), Dv = vc.size(3);
  at::Tensor S = initial_state.defined() ? host_fp32(initial_state, "gated_delta_rule_rows").clone()
                                         : at::zeros({B, H, Dk, Dv}, qc.options());  // [B, H, Dk, Dv]
  SLIMPI_CHECK(S.sizes() == at::IntArrayRef({B, H, Dk, Dv}), "gated_delta_rule_rows: initial state [B, H, Dk, Dv]");
  at::Tensor o = at::empty({B, L, H, Dv}, qc.options());
  const float *qp = qc.data_ptr<float>(), *kp = kc.data_ptr<float>(), *vp = vc.data_ptr<float>();
  const float *gp = gc.data_ptr<float>(), *bp = bc.data_ptr<float>();
  float *op = o.data_ptr<float>(), *sp = S.data_ptr<float>();
  at::parallel_for(0, B * H, 1, [&](int64_t p0, int64_t p1) {
    std::vector<float>& kS = scratch(0, Dv);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t b = p / H, h = p % H;
      const int64_t qk0 = (b * L * H + h) * Dk, v0 = (b * L * H + h) * Dv, gb0 = b * L * H + h;
      delta_rule_head(qp + qk0, kp + qk0, vp + v0, gp + gb0, bp + gb0, op + v0, sp + p * Dk * Dv, L, Dk, Dv, H * Dk,
                      H * Dv, H, kS.data());
    }
  });
  if (final_state) *final_state = S;
  return o;
}

void set_exact_numerics(bool on) { exact_on.store(on); }

namespace {
std::atomic<at::ScalarType> kv_storage{at::kFloat};
}  // namespace
void set_exact_kv_storage(at::ScalarType storage) { kv_storage.store(storage); }
at::ScalarType exact_kv_storage() { return kv_storage.load(); }

int exact_kernel_level() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("x86-64-v4") ? 4 : __builtin_cpu_supports("x86-64-v3") ? 3 : 1;
#else
  return 0;
#endif
}
bool exact_numerics() { return exact_on.load(); }

}  // namespace slimpi
