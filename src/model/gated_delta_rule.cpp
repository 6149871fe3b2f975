#include "model/gated_delta_rule.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include <limits>
#include <vector>

namespace slimpi {
namespace {

void check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                  const at::Tensor& beta, const at::Tensor& initial_state) {
  SLIMPI_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 && v.size(0) == q.size(0) &&
                   v.size(1) == q.size(1) && v.size(2) == q.size(2) && g.sizes() == q.sizes().slice(0, 3) &&
                   beta.sizes() == g.sizes(),
               "gated delta rule: q/k [B, L, H, Dk], v [B, L, H, Dv], g/beta [B, L, H] expected");
  SLIMPI_CHECK(!initial_state.defined() ||
                   initial_state.sizes() == at::IntArrayRef({q.size(0), q.size(2), q.size(3), v.size(3)}),
               "gated delta rule: initial state [B, H, Dk, Dv] expected");
}

at::Tensor start_state(const at::Tensor& q, const at::Tensor& v, const at::Tensor& initial_state) {
  if (initial_state.defined()) return initial_state.to(q.scalar_type());
  return at::zeros({q.size(0), q.size(2), q.size(3), v.size(3)}, q.options());  // [B, H, Dk, Dv]
}

}  // namespace

at::Tensor gated_delta_rule_recurrent(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& g, const at::Tensor& beta, const at::Tensor& initial_state,
                                      at::Tensor* final_state) {
  check_shapes(q, k, v, g, beta, initial_state);
  at::Tensor S = start_state(q, v, initial_state);  // [B, H, Dk, Dv]
  std::vector<at::Tensor> out;
  for (int64_t t = 0; t < q.size(1); ++t) {
    const at::Tensor qt = q.select(1, t).unsqueeze(-2), kt = k.select(1, t).unsqueeze(-2);  // [B, H, 1, Dk]
    const at::Tensor vt = v.select(1, t).unsqueeze(-2);                                     // [B, H, 1, Dv]
    S = S * g.select(1, t).exp().unsqueeze(-1).unsqueeze(-1);
    const at::Tensor u = (vt - at::matmul(kt, S)) * beta.select(1, t).unsqueeze(-1).unsqueeze(-1);  // [B, H, 1, Dv]
    S = S + at::matmul(kt.transpose(-1, -2), u);                                                     // k u^T
    out.push_back(at::matmul(qt, S).squeeze(-2));                                                    // [B, H, Dv]
  }
  if (final_state) *final_state = S;
  return at::stack(out, 1);  // [B, L, H, Dv]
}

at::Tensor gated_delta_rule_chunked(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                    const at::Tensor& g_in, const at::Tensor& beta_in, const at::Tensor& initial_state,
                                    at::Tensor* final_state, int64_t C) {
  check_shapes(q_in, k_in, v_in, g_in, beta_in, initial_state);
  SLIMPI_CHECK(C >= 1, "gated delta rule: chunk of {} tokens", C);
  const int64_t B = q_in.size(0), L = q_in.size(1), H = q_in.size(2), Dv = v_in.size(3);  // (Dk: q_in.size(3))
  const int64_t N = (L + C - 1) / C, pad = N * C - L;
  // [B, L, H, X] -> [B, H, N, C, X], zero-padded past L (g = beta = 0: the state passes unchanged)
  auto chunks = [&](const at::Tensor& x) {
    const at::Tensor p = pad ? at::constant_pad_nd(x, {0, 0, 0, 0, 0, pad}) : x;
    return p.permute({0, 2, 1, 3}).reshape({B, H, N, C, x.size(3)});
  };
  auto chunks_h = [&](const at::Tensor& x) {  // [B, L, H] -> [B, H, N, C]
    const at::Tensor p = pad ? at::constant_pad_nd(x, {0, 0, 0, pad}) : x;
    return p.permute({0, 2, 1}).reshape({B, H, N, C});
  };
  const at::Tensor q = chunks(q_in), k = chunks(k_in), v = chunks(v_in);  // [B, H, N, C, D]
  const at::Tensor beta = chunks_h(beta_in);                               // [B, H, N, C]
  const at::Tensor g = chunks_h(g_in);                                     // [B, H, N, C]
  const at::Tensor gamma = g.cumsum(-1);                                   // [B, H, N, C]
  const auto bool_opts = at::TensorOptions().dtype(at::kBool).device(q.device());
  const at::Tensor on_or_below = at::ones({C, C}, bool_opts).tril();  // j <= i
  const at::Tensor below = at::ones({C, C}, bool_opts).tril(-1);      // j < i
  // gamma_i - gamma_j (j <= i) as the sum of its own terms, g_{j+1} + .. + g_i, not as the
  // difference of two running sums: those reach the sum of the whole chunk's decays (~1e3
  // where a head forgets fast), and their difference would keep only ~1e3 · 6e-8 of
  // absolute precision, a relative error of ~1e-4 in every e^{gamma_i - gamma_j}. Every
  // g <= 0, so a term that matters (a sum > -20) is a sum of small terms, exact to ~ulp.
  const at::Tensor seg = g.unsqueeze(-1).expand({B, H, N, C, C}).masked_fill(below.logical_not(), 0.0).cumsum(-2);
  // e^{gamma_i - gamma_j} for j <= i, 0 above the diagonal (masked before exp: no overflow)
  const at::Tensor decay =
      seg.masked_fill(on_or_below.logical_not(), -std::numeric_limits<double>::infinity()).exp();  // [B, H, N, C, C]
  const at::Tensor kk = at::matmul(k, k.transpose(-1, -2));                             // [B, H, N, C, C]
  const at::Tensor A = (beta.unsqueeze(-1) * decay * kk).masked_fill(below.logical_not(), 0.0);
  const at::Tensor I_plus_A = A + at::eye(C, q.options());
  const at::Tensor e_gamma = gamma.exp();                                               // [B, H, N, C]
  const at::Tensor w_v = at::linalg_solve_triangular(I_plus_A, beta.unsqueeze(-1) * v, /*upper=*/false,
                                                     /*left=*/true, /*unitriangular=*/true);  // [B, H, N, C, Dv]
  const at::Tensor w_k = at::linalg_solve_triangular(I_plus_A, (beta * e_gamma).unsqueeze(-1) * k, false, true,
                                                     true);                             // [B, H, N, C, Dk]
  const at::Tensor m = at::matmul(q, k.transpose(-1, -2)) * decay;                      // [B, H, N, C, C]
  const at::Tensor q_decayed = e_gamma.unsqueeze(-1) * q;                               // [B, H, N, C, Dk]
  const at::Tensor gamma_end = gamma.narrow(-1, C - 1, 1);                              // [B, H, N, 1]
  const at::Tensor k_to_end = seg.select(-2, C - 1).exp().unsqueeze(-1) * k;            // [B, H, N, C, Dk]
  const at::Tensor decay_end = gamma_end.exp().unsqueeze(-1);                           // [B, H, N, 1, 1]
  at::Tensor S = start_state(q_in, v_in, initial_state);                                // [B, H, Dk, Dv]
  std::vector<at::Tensor> out;
  for (int64_t n = 0; n < N; ++n) {
    const at::Tensor u = w_v.select(2, n) - at::matmul(w_k.select(2, n), S);                     // [B, H, C, Dv]
    out.push_back(at::matmul(q_decayed.select(2, n), S) + at::matmul(m.select(2, n), u));        // [B, H, C, Dv]
    S = decay_end.select(2, n) * S + at::matmul(k_to_end.select(2, n).transpose(-1, -2), u);     // [B, H, Dk, Dv]
  }
  if (final_state) *final_state = S;
  const at::Tensor o = at::stack(out, 2).reshape({B, H, N * C, Dv});  // [B, H, N·C, Dv]
  return o.narrow(2, 0, L).permute({0, 2, 1, 3});                     // [B, L, H, Dv]
}

}  // namespace slimpi
