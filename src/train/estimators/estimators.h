// The advantage estimators, one file each (its formula, its reward centring, the policy
// loss it trains with, what it needs, its own deck rules), collected into
// advantage_estimators() (train/advantages.cpp). A new estimator is one file here, one
// line in that registry and one row in the tests.
#pragma once

#include <ATen/core/Tensor.h>

#include "train/advantages.h"

namespace slimpi {

AdvantageEstimator grpo_estimator();
AdvantageEstimator gspo_estimator();
AdvantageEstimator cispo_estimator();
AdvantageEstimator rloo_estimator();
AdvantageEstimator remax_estimator();
AdvantageEstimator reinforce_plus_plus_estimator();
AdvantageEstimator reinforce_plus_plus_baseline_estimator();
AdvantageEstimator ppo_estimator();

// A_t = r for every token: the estimators whose advantage is the sample's post-processed reward.
at::Tensor constant_advantage(const AdvantageInputs& in);

}  // namespace slimpi
