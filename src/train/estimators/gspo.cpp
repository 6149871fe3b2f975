// GSPO: GRPO's advantage A_t = r (group mean and std) trained with the sequence-level
// importance ratio (policy loss "gspo", train/policy_loss.h).
#include "train/estimators/estimators.h"

namespace slimpi {

AdvantageEstimator gspo_estimator() {
  AdvantageEstimator e;
  e.name = "gspo";
  e.advantages = constant_advantage;
  e.centring = RewardCentring::MeanStd;
  e.policy_loss = "gspo";
  return e;
}

}  // namespace slimpi
