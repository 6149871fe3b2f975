// The operations of a forward that a sampled token's log-prob depends on, each with two
// computations: ATen's (the default), and under exact numerics (train.on_policy =
// "exact", kernels/batch_invariant.h) the batch-invariant kernels, so that the trainer's
// forward over packed sequences and the engine's over any batch, prefix hit, prefill
// chunk or verify pass give a row the same bits (docs/exact_on_policy.md). Under
// autograd the kernels give the value and ATen's formula the gradient (the backward may
// use any arithmetic: only the forward's values must agree). In a bf16 forward the
// kernels take their inputs widened to fp32 (exact) and each value is rounded once to the
// dtype ATen's op gives. Matrix products go through dense() (kernels/small_batch_linear.h),
// attention through attend() (model/attention.h).
#pragma once

#include <ATen/core/Tensor.h>

namespace slimpi {

// RMSNorm: (x / sqrt(mean(x²) + eps)) · w in fp32, then w's dtype. x [..., n], w [n].
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps);

// SwiGLU's product silu(g) · u; g, u the same shape.
at::Tensor swiglu(const at::Tensor& g, const at::Tensor& u);

// sigmoid(x), element-wise (gated attention's gate, a shared expert's gate, a sigmoid router).
at::Tensor sigmoid_of(const at::Tensor& x);

// silu(x) and softplus(x) (torch's: x past 20), element-wise (Gated DeltaNet's
// convolution and gate, its log decay).
at::Tensor silu_of(const at::Tensor& x);
at::Tensor softplus_of(const at::Tensor& x);

// x / sqrt(Σ_last x² + eps): Gated DeltaNet's q and k normalisation (the FLA library's
// l2norm, eps 1e-6 in transformers). x [..., n].
at::Tensor l2_normalize_last(const at::Tensor& x, double eps);

// The gated delta rule over padded sequences (model/gated_delta_rule.h's shapes and
// definition): by default the chunked form, or the recurrent one for a decode step
// (`one_token_steps`: an incremental forward of one token a sequence); under exact
// numerics always token by token (kernels/batch_invariant.h gated_delta_rule_rows), so
// that the trainer's pass over a whole sequence, prefill in any chunks and decode steps
// give a token the same bits; training's gradient is the chunked form's.
at::Tensor gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                            const at::Tensor& beta, const at::Tensor& initial_state, at::Tensor* final_state,
                            bool one_token_steps);

// Softmax over the last dimension (a softmax router's probabilities). x [R, E] fp32.
at::Tensor softmax_last(const at::Tensor& x);

// x / (Σ_last x + eps), the chosen experts' weights renormalised. x [T, k] fp32.
at::Tensor normalize_last(const at::Tensor& x, double eps);

// Log-probs of sampled tokens from fp32 logits: z = logits / temperature[r] (one
// temperature a row), logp = log-softmax of z over the support at targets
// (model/log_probs.h's definition). logits [N, V], temperature [N] fp32, targets [N]
// int64, support [N] int64 or undefined -> [N] fp32. Differentiable in logits.
at::Tensor sampled_token_log_probs(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& targets,
                                   const at::Tensor& support);

}  // namespace slimpi
