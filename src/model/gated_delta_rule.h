// The gated delta rule — the recurrence of a Gated DeltaNet layer (Qwen3.5, Qwen3-Next;
// Yang et al., "Gated Delta Networks", 2024) — in two forms that compute the same thing:
//
//   S_t = exp(g_t) S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t)
//   o_t = S_t^T q_t
//
// per sequence and value head, S [Dk, Dv] the recurrent state, g_t <= 0 the log decay,
// beta_t in (0, 1) the write strength, q_t / k_t [Dk] (the caller normalises them), v_t [Dv].
//
//   recurrent  token by token (the engine's decode step; the reference of the tests)
//   chunked    chunks of C tokens at once (training and prefill). Within a chunk, with
//              gamma_i = sum_{j<=i} g_j and S_0 the state entering it, unrolling gives
//                u_i = beta_i (v_i - e^{gamma_i} S_0^T k_i - sum_{j<i} e^{gamma_i - gamma_j} (k_i.k_j) u_j)
//              so (I + A) U = beta (V - e^gamma K S_0) with A_ij = beta_i e^{gamma_i - gamma_j} k_i.k_j
//              (j < i): U = W_v - W_k S_0, W_v = (I + A)^-1 beta V, W_k = (I + A)^-1 beta e^gamma K
//              (one unit-lower-triangular solve per chunk, independent of S_0). Then
//                O = (e^gamma Q) S_0 + M U,   M_ij = e^{gamma_i - gamma_j} q_i.k_j (j <= i)
//                S_C = e^{gamma_C} S_0 + (e^{gamma_C - gamma} K)^T U
//              and only the last two lines run chunk after chunk. Every exponent is of a
//              difference gamma_i - gamma_j with j <= i, so <= 0: nothing overflows.
//
// Both take padded batches: q, k [B, L, H, Dk], v [B, L, H, Dv], g, beta [B, L, H], in the
// dtype they come (the layer passes fp32; the tests fp64). Positions past a sequence's end
// must carry g = 0 and beta = 0: the state then passes them unchanged, so the final state
// is the state after the sequence's last real token (their outputs are garbage, dropped
// by the caller). initial_state [B, H, Dk, Dv] (undefined: zeros). Returns o [B, L, H, Dv];
// *final_state (when given) the state after position L - 1. Autograd flows through both
// (the chunked form is what training differentiates).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace slimpi {

at::Tensor gated_delta_rule_recurrent(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& g, const at::Tensor& beta, const at::Tensor& initial_state,
                                      at::Tensor* final_state = nullptr);

constexpr int64_t kDeltaRuleChunk = 64;

at::Tensor gated_delta_rule_chunked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& g, const at::Tensor& beta, const at::Tensor& initial_state,
                                    at::Tensor* final_state = nullptr, int64_t chunk = kDeltaRuleChunk);

}  // namespace slimpi
