// Generalised advantage estimation (PPO with a critic, train.advantage_estimator = "ppo"),
// slime's ppo_utils.vanilla_gae over one sample's response, made mask-aware.
//
// Over the counted response tokens t_1 < ... < t_n of a sample (loss mask 1; the tokens
// in between, e.g. an environment's, are skipped: the next value is that of the next
// counted token, "carry-forward" masking):
//   δ_k = r_k + γ·V_{k+1} − V_k            (V_{n+1} = 0: the episode ends)
//   A_k = δ_k + γλ·A_{k+1}                  (A_{n+1} = 0)
//   G_k = A_k + V_k                         (the value targets)
// A token reward r at an uncounted position is added, undiscounted, to the counted token
// before it (the action it followed). Uncounted positions get A = 0 and G = V. With every
// token counted this is slime's vanilla_gae exactly (its chunked scan is the same sums).
// Token rewards (slime's PPO): r_t = −kl_coef·kl_t on counted tokens, plus the sample's
// reward on its last counted token (token_rewards in train/advantages.h).
#pragma once

#include <ATen/core/Tensor.h>

namespace slimpi {

struct GaeResult {
  at::Tensor advantages;  // [R] fp32
  at::Tensor returns;     // [R] fp32: advantages + values
};

// rewards, values, mask: [R] (any float dtype, CPU or not); the scan runs in fp64 on the CPU.
GaeResult generalized_advantages(const at::Tensor& rewards, const at::Tensor& values, const at::Tensor& mask,
                                 double gamma, double lambd);

}  // namespace slimpi
