#include "train/advantages.h"

#include <ATen/ATen.h>
#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <cmath>

#include "train/estimators/estimators.h"

namespace slimpi {

const Registry<AdvantageEstimator>& advantage_estimators() {
  static const Registry<AdvantageEstimator> r = [] {
    Registry<AdvantageEstimator> reg("train.advantage_estimator");
    for (const AdvantageEstimator& e :
         {grpo_estimator(), gspo_estimator(), cispo_estimator(), reinforce_plus_plus_estimator(),
          reinforce_plus_plus_baseline_estimator(), rloo_estimator(), ppo_estimator(), remax_estimator()})
      reg.add(e.name, e);
    return reg;
  }();
  return r;
}

at::Tensor constant_advantage(const AdvantageInputs& in) { return at::full_like(in.mask, in.reward); }

void check_estimator_deck(const AdvantageEstimator& estimator, const Deck& deck) {
  // A group baseline centres each reward on its group's mean: with one sample per group
  // every advantage is 0 and nothing learns (slime's group math needs n >= 2).
  if (estimator.group_baseline() && deck.get_int("rollout.n_samples_per_prompt") < 2 &&
      !deck.get_bool("debug.rollout_only") && !deck.get_bool("train.disable_rewards_normalization"))
    SLIMPI_FAIL_ALL("rollout.n_samples_per_prompt = 1 ({}) with train.advantage_estimator = \"{}\" ({}): each reward "
                    "is centred on its group's mean, its own, so every advantage is 0 and nothing learns; use groups of "
                    "2 or more, an estimator without a group baseline (reinforce_plus_plus), or "
                    "train.disable_rewards_normalization = true",
                    deck.source("rollout.n_samples_per_prompt"), estimator.name,
                    deck.source("train.advantage_estimator"));
  if (estimator.check_deck) estimator.check_deck(deck);
}

namespace {

at::Tensor kl_or_zeros(const AdvantageInputs& in) { return in.kl.defined() ? in.kl : at::zeros_like(in.mask); }

}  // namespace

at::Tensor token_rewards(const AdvantageInputs& in) {
  at::Tensor reward = -in.kl_coef * kl_or_zeros(in) * in.mask;  // [R]
  at::Tensor counted = at::nonzero(in.mask).flatten();
  if (counted.numel() > 0) reward[counted[-1].item<int64_t>()] += in.reward;
  return reward;
}

at::Tensor discounted_returns(const at::Tensor& x, double gamma) {
  at::Tensor xd = x.to(at::kDouble).cpu().contiguous();
  at::Tensor out = at::empty_like(xd);
  const double* in = xd.data_ptr<double>();
  double* g = out.data_ptr<double>();
  double running = 0;
  for (int64_t t = xd.numel() - 1; t >= 0; --t) g[t] = running = in[t] + gamma * running;
  return out.to(x.options());
}

std::vector<float> postprocess_rewards(const AdvantageEstimator& estimator, const std::vector<float>& rewards,
                                       int64_t n_per_group, const RewardNormalization& norm,
                                       const std::vector<float>& baselines) {
  SLIMPI_CHECK(n_per_group >= 1 && rewards.size() % n_per_group == 0,
               "{} rewards do not split into groups of {}", rewards.size(), n_per_group);
  const RewardCentring centring = estimator.centring;
  SLIMPI_CHECK((centring == RewardCentring::Greedy) == !baselines.empty() &&
                   (baselines.empty() || baselines.size() * size_t(n_per_group) == rewards.size()),
               "{}: {} greedy baselines for {} rewards in groups of {}", estimator.name, baselines.size(), rewards.size(),
               n_per_group);
  const bool centred = norm.enabled && centring != RewardCentring::None;
  const bool scaled = centred && norm.std_enabled && n_per_group > 1 && centring == RewardCentring::MeanStd;
  std::vector<float> out(rewards);
  if (!centred) return out;
  if (centring == RewardCentring::Greedy) {
    for (size_t i = 0; i < rewards.size(); ++i) out[i] = rewards[i] - baselines[i / size_t(n_per_group)];
    return out;
  }
  for (size_t g = 0; g < rewards.size(); g += n_per_group) {
    double mean = 0;
    for (int64_t i = 0; i < n_per_group; ++i) mean += rewards[g + i];
    mean /= n_per_group;
    double var = 0;
    for (int64_t i = 0; i < n_per_group; ++i) var += (rewards[g + i] - mean) * (rewards[g + i] - mean);
    const double std_dev = n_per_group > 1 ? std::sqrt(var / (n_per_group - 1)) : 0.0;
    // Leave-one-out: R_i − (n·mean − R_i)/(n − 1) = n/(n − 1)·(R_i − mean).
    const double loo = centring == RewardCentring::LeaveOneOut && n_per_group > 1
                           ? double(n_per_group) / double(n_per_group - 1)
                           : 1.0;
    for (int64_t i = 0; i < n_per_group; ++i) {
      double r = (rewards[g + i] - mean) * loo;
      if (scaled) r /= (std_dev + 1e-6);
      out[g + i] = static_cast<float>(r);
    }
  }
  return out;
}

}  // namespace slimpi
