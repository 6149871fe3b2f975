// REINFORCE++ (slime's reinforce_plus_plus): no group post-processing; per response token
// t, reward_t = −kl_coef·kl_t·m_t plus the raw reward R at the last counted token, and
// A_t = G_t = Σ_k γ^k reward_{t+k} (train/advantages.h: token_rewards, discounted_returns).
// slime refuses it without train.normalize_advantages.
#include "train/estimators/estimators.h"

namespace slimpi {

AdvantageEstimator reinforce_plus_plus_estimator() {
  AdvantageEstimator e;
  e.name = "reinforce_plus_plus";
  e.advantages = [](const AdvantageInputs& in) {
    return discounted_returns(token_rewards(in), in.gamma);
  };
  e.centring = RewardCentring::None;
  e.reward_kl = true;
  e.needs_normalized_advantages = true;
  return e;
}

}  // namespace slimpi
