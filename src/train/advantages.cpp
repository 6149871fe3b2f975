#include "train/advantages.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include <cmath>

#include "train/gae.h"

namespace slimpi {
namespace {

at::Tensor kl_or_zeros(const AdvantageInputs& in) {
  return in.kl.defined() ? in.kl : at::zeros_like(in.mask);
}

at::Tensor constant_advantage(const AdvantageInputs& in) { return at::full_like(in.mask, in.reward); }

at::Tensor reinforce_plus_plus(const AdvantageInputs& in) { return discounted_returns(token_rewards(in), in.gamma); }

at::Tensor ppo_gae(const AdvantageInputs& in) {
  SLIMPI_CHECK(in.values.defined() && in.values.numel() == in.mask.numel(),
               "the ppo estimator needs the critic's value of every response token");
  return generalized_advantages(token_rewards(in), in.values, in.mask, in.gamma, in.lambd).advantages;
}

at::Tensor reinforce_plus_plus_baseline(const AdvantageInputs& in) {
  return in.reward - in.kl_coef * kl_or_zeros(in);
}

}  // namespace

const Registry<AdvantageEstimator>& advantage_estimators() {
  static const Registry<AdvantageEstimator> r = [] {
    Registry<AdvantageEstimator> reg("train.advantage_estimator");
    reg.add("grpo", {constant_advantage, RewardCentring::MeanStd, "ppo_clip"});
    reg.add("gspo", {constant_advantage, RewardCentring::MeanStd, "gspo"});
    reg.add("cispo", {constant_advantage, RewardCentring::MeanStd, "cispo"});
    reg.add("reinforce_plus_plus", {reinforce_plus_plus, RewardCentring::None, "ppo_clip"});
    reg.add("reinforce_plus_plus_baseline", {reinforce_plus_plus_baseline, RewardCentring::Mean, "ppo_clip"});
    reg.add("rloo", {constant_advantage, RewardCentring::LeaveOneOut, "ppo_clip"});
    reg.add("ppo", {ppo_gae, RewardCentring::None, "ppo_clip", /*needs_critic=*/true});
    reg.add("remax", {constant_advantage, RewardCentring::Greedy, "ppo_clip"});
    return reg;
  }();
  return r;
}

at::Tensor compute_advantages(const std::string& estimator, const AdvantageInputs& in) {
  return advantage_estimators().get(estimator).advantages(in);
}

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

std::vector<float> postprocess_rewards(const std::string& estimator, const std::vector<float>& rewards,
                                       int64_t n_per_group, const RewardNormalization& norm,
                                       const std::vector<float>& baselines) {
  SLIMPI_CHECK(n_per_group >= 1 && rewards.size() % n_per_group == 0,
               "{} rewards do not split into groups of {}", rewards.size(), n_per_group);
  const RewardCentring centring = advantage_estimators().get(estimator).centring;
  SLIMPI_CHECK((centring == RewardCentring::Greedy) == !baselines.empty() &&
                   (baselines.empty() || baselines.size() * size_t(n_per_group) == rewards.size()),
               "{}: {} greedy baselines for {} rewards in groups of {}", estimator, baselines.size(), rewards.size(),
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
