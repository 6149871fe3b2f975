// GRPO (slime's default): every token of a sample carries its group-normalised reward,
// A_t = r = (R − mean_group R) / (std_group R + 1e-6), std unbiased; trained with PPO's
// clipped ratio per token.
#include "train/estimators/estimators.h"

namespace slimpi {

AdvantageEstimator grpo_estimator() {
  AdvantageEstimator e;
  e.name = "grpo";
  e.advantages = constant_advantage;
  e.centring = RewardCentring::MeanStd;
  return e;
}

}  // namespace slimpi
