// REINFORCE++ with a group baseline (slime's reinforce_plus_plus_baseline): the reward
// centred on its group's mean, r = R − mean_group R, and A_t = r − kl_coef·kl_t.
// slime refuses it without train.normalize_advantages.
#include <ATen/ATen.h>

#include "train/estimators/estimators.h"

namespace slimpi {

AdvantageEstimator reinforce_plus_plus_baseline_estimator() {
  AdvantageEstimator e;
  e.name = "reinforce_plus_plus_baseline";
  e.advantages = [](const AdvantageInputs& in) {
    return in.reward - in.kl_coef * (in.kl.defined() ? in.kl : at::zeros_like(in.mask));
  };
  e.centring = RewardCentring::Mean;
  e.reward_kl = true;
  e.needs_normalized_advantages = true;
  return e;
}

}  // namespace slimpi
