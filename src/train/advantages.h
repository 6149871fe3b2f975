// Reward post-processing and advantage estimators (slime's definitions), each
// estimator a registry entry keyed by the deck's train.advantage_estimator string and
// written in a file of its own (train/estimators/: its formula, its traits, its deck
// rules), resolved once into TrainerConfig::estimator.
//
// Reward post-processing, per group of n samples of one prompt, by the estimator's
// RewardCentring (unless disable_rewards_normalization):
//   Mean:        r = R − mean_group(R)
//   MeanStd:     r = (R − mean_group(R)) / (std_group + 1e-6), std unbiased (N−1), unless
//                disable_grpo_std_normalization; the std forced off when n = 1
//   LeaveOneOut: r_i = R_i − Σ_{j≠i} R_j / (n − 1) = n/(n − 1)·(R_i − mean); a group's r
//                sum to 0 (n = 1: r = 0, refused by the deck check)
//   Greedy:      r_i = R_i − R_greedy, the reward of the group's greedy response,
//                generated beside the group and not trained
//   None:        r = R
// Estimators (per response token t of a sample, mask m_t, kl_t vs the reference):
//   grpo, gspo, cispo, rloo, remax: A_t = r
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
class Deck;
}

namespace slimpi {

struct RewardNormalization {
  bool enabled = true;       // !disable_rewards_normalization
  bool std_enabled = true;   // !disable_grpo_std_normalization
};

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
// post-processing it expects, the policy loss it trains with (a name in
// policy_losses(), train/policy_loss.h), what it needs and its own deck rules.
struct AdvantageEstimator {
  std::string name;  // its train.advantage_estimator
  std::function<at::Tensor(const AdvantageInputs&)> advantages;  // one sample's A_t [R]
  RewardCentring centring = RewardCentring::None;
  std::string policy_loss = "ppo_clip";
  bool needs_critic = false;  // its advantages read AdvantageInputs::values (train/critic.h)
  bool reward_kl = false;     // train.kl_coef enters its per-token rewards (kl_coef acts on no other)
  bool needs_normalized_advantages = false;  // slime refuses it without train.normalize_advantages
  std::function<void(const Deck&)> check_deck;  // its own rules between deck keys (RL decks), or empty

  // The reward is centred within its group (n >= 2 samples needed to learn anything).
  bool group_baseline() const {
    return centring == RewardCentring::Mean || centring == RewardCentring::MeanStd ||
           centring == RewardCentring::LeaveOneOut;
  }
  bool greedy_baseline() const { return centring == RewardCentring::Greedy; }
};
const Registry<AdvantageEstimator>& advantage_estimators();

// rewards of a whole step, `n_per_group` consecutive samples per prompt -> r, as
// `estimator`'s centring asks. baselines: one per group, the reward of its greedy
// response (RewardCentring::Greedy; empty otherwise).
std::vector<float> postprocess_rewards(const AdvantageEstimator& estimator, const std::vector<float>& rewards,
                                       int64_t n_per_group, const RewardNormalization& norm,
                                       const std::vector<float>& baselines = {});

// The estimator's rules on an RL deck: its traits against the keys (a group baseline
// with n_samples_per_prompt = 1, train.kl_coef, train.normalize_advantages, the
// critic's keys, GAE's lambdas), then its own check_deck. Every rank alike.
void check_estimator_deck(const AdvantageEstimator& estimator, const Deck& deck);

// The per-token rewards of reinforce_plus_plus and ppo: −kl_coef·kl_t·m_t, plus the
// reward on the last counted token (m_t = 1). [R]
at::Tensor token_rewards(const AdvantageInputs& in);

// G_t = Σ_k γ^k x_{t+k}, the serial scan. x [R] -> [R].
at::Tensor discounted_returns(const at::Tensor& x, double gamma);

}  // namespace slimpi
