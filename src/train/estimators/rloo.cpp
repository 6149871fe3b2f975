// RLOO (REINFORCE leave-one-out, as verl and OpenRLHF): the baseline of sample i is the
// mean of its group's other samples, A_t = r_i = R_i − Σ_{j≠i} R_j / (n − 1).
#include "train/estimators/estimators.h"

namespace slimpi {

AdvantageEstimator rloo_estimator() {
  AdvantageEstimator e;
  e.name = "rloo";
  e.advantages = constant_advantage;
  e.centring = RewardCentring::LeaveOneOut;
  return e;
}

}  // namespace slimpi
