// Reward post-processing and advantage estimators (slime's definitions), each
// estimator a registry entry keyed by the deck's train.advantage_estimator string.
//
// Reward post-processing, per group of n samples of one prompt (grpo, gspo, cispo,
// reinforce_plus_plus_baseline, rloo, unless disable_rewards_normalization):
//   r = R − mean_group(R); for grpo/gspo/cispo also r /= (std_group + 1e-6), std
//   unbiased (N−1), unless disable_grpo_std_normalization; forced off when n = 1.
//   rloo (REINFORCE leave-one-out, as verl and OpenRLHF): the baseline is the mean of
//   the group's other samples, r_i = R_i − Σ_{j≠i} R_j / (n − 1) = n/(n − 1)·(R_i − mean);
//   a group's r sum to 0 (n = 1: r = 0, refused by the deck check).
//   remax (ReMax, as verl): the baseline is the reward of the group's greedy response,
//   generated beside the group and not trained: r_i = R_i − R_greedy.
// Estimators (per response token t of a sample, mask m_t, kl_t vs the reference):
//   grpo, gspo, cispo, rloo:       A_t = r
//   reinforce_plus_plus:           reward_t = −kl_coef·kl_t·m_t (+ R at the last masked
//                                  token); A_t = G_t = Σ_k γ^k reward_{t+k}
//   reinforce_plus_plus_baseline:  A_t = r − kl_coef·kl_t
//   ppo:                           reward_t as reinforce_plus_plus (R the raw reward, no
//                                  group post-processing); A = GAE over the critic's
//                                  values with γ, λ (train/gae.h)
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "core/registry.h"

namespace slimpi {

struct RewardNormalization {
  bool enabled = true;       // !disable_rewards_normalization
  bool std_enabled = true;   // !disable_grpo_std_normalization
};

// rewards of a whole step, `n_per_group` consecutive samples per prompt -> r.
// baselines: one per group, the reward of its greedy response (estimators with
// RewardCentring::Greedy; empty otherwise).
std::vector<float> postprocess_rewards(const std::string& estimator, const std::vector<float>& rewards,
                                       int64_t n_per_group, const RewardNormalization& norm,
                                       const std::vector<float>& baselines = {});

struct AdvantageInputs {
  float reward = 0;    // after post-processing (r), or raw R for reinforce_plus_plus
  at::Tensor mask;     // [R] float loss mask
  at::Tensor kl;       // [R] kl_t to the reference; undefined = zeros
  double kl_coef = 0;  // reward-KL coefficient
  double gamma = 1.0;  // discount (reinforce_plus_plus, ppo)
  double lambd = 1.0;  // GAE's λ (ppo)
  at::Tensor values;   // [R] the critic's values (ppo)
};

// How an estimator's group post-processing treats the raw rewards.
enum class RewardCentring { None, Mean, MeanStd, LeaveOneOut, Greedy };

// One registry entry: the per-token advantages [R] of one sample, the reward
// post-processing it expects, and the policy loss it trains with (a name in
// policy_losses(), train/policy_loss.h).
struct AdvantageEstimator {
  std::function<at::Tensor(const AdvantageInputs&)> advantages;
  RewardCentring centring = RewardCentring::None;
  std::string policy_loss = "ppo_clip";
  bool needs_critic = false;  // its advantages read AdvantageInputs::values (train/critic.h)
};
const Registry<AdvantageEstimator>& advantage_estimators();

// Per-token advantages [R] of one sample.
at::Tensor compute_advantages(const std::string& estimator, const AdvantageInputs& in);

// The per-token rewards of reinforce_plus_plus and ppo: −kl_coef·kl_t·m_t, plus the
// reward on the last counted token (m_t = 1). [R]
at::Tensor token_rewards(const AdvantageInputs& in);

// G_t = Σ_k γ^k x_{t+k}, the serial scan. x [R] -> [R].
at::Tensor discounted_returns(const at::Tensor& x, double gamma);

}  // namespace slimpi
