// CISPO: GRPO's advantage A_t = r (group mean and std) trained with the clipped-IS-weight
// policy loss ("cispo", train/policy_loss.h).
#include "train/estimators/estimators.h"

namespace slimpi {

AdvantageEstimator cispo_estimator() {
  AdvantageEstimator e;
  e.name = "cispo";
  e.advantages = constant_advantage;
  e.centring = RewardCentring::MeanStd;
  e.policy_loss = "cispo";
  return e;
}

}  // namespace slimpi
