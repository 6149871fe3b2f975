// Trainer::train_rollout: a prepared rollout's optimizer steps, the critic's epochs and
// warm-up first (PPO), then the policy's steps over the same consecutive parts.
#include <fmt/format.h>

#include <iterator>

#include "core/log.h"
#include "train/trainer.h"

namespace slimpi {

std::map<std::string, double> Trainer::train_rollout(std::vector<Sample>& local, int64_t n_steps, int64_t step) {
  std::map<std::string, double> metrics;
  const bool old_copied = old_from_first_step_;  // (Trainer::old_from_first_step_)
  // The rollout's samples in n_steps consecutive parts, one optimizer step each.
  const size_t n_local = local.size();
  auto each_part = [&](auto&& step_on) {
    for (int64_t s = 0; s < n_steps; ++s) {
      std::vector<Sample> part(std::make_move_iterator(local.begin() + n_local * s / n_steps),
                               std::make_move_iterator(local.begin() + n_local * (s + 1) / n_steps));
      step_on(s, part);
      std::move(part.begin(), part.end(), local.begin() + n_local * s / n_steps);
    }
  };
  bool train_policy = true;
  if (critic_) {
    const CriticConfig& cc = cfg_.critic;
    std::map<std::string, double> critic_sums;
    for (int64_t epoch = 0; epoch < cc.n_epochs; ++epoch)
      each_part([&](int64_t, std::vector<Sample>& part) {
        for (const auto& [k, v] : critic_->train_step(part)) critic_sums[k] += v / double(n_steps * cc.n_epochs);
      });
    critic_->end_rollout();
    for (const auto& [k, v] : critic_sums) metrics[k] = v;
    metrics["train/critic_steps"] = double(n_steps * cc.n_epochs);
    if (critic_->n_rollouts() <= cc.warmup_rollouts) {
      log::info("step {}: critic warm-up rollout {} of {} (critic.warmup_rollouts): the policy is not trained", step + 1,
                critic_->n_rollouts(), cc.warmup_rollouts);
      train_policy = false;
    }
  }
  std::map<std::string, double> sums;
  if (train_policy) each_part([&](int64_t s, std::vector<Sample>& part) {
    for (const auto& [k, v] : train_step(part)) {
      sums[k] += v / double(n_steps);
      if (k.rfind("train/", 0) == 0) metrics[fmt::format("train_step/{}/{}", s, k.substr(6))] = v;
    }
    old_from_first_step_ = false;  // (the first step wrote its forward's log-probs into the samples)
  });
  old_from_first_step_ = false;  // (also when the policy was not trained)
  for (const auto& [k, v] : sums) metrics[k] = v;
  if (old_copied && train_policy) {
    // The old log-probs came from the rollout (exact on-policy): only the first step's
    // part had them replaced by the trainer's own forward; the later parts' would compare
    // the rollout's with themselves. The trainer-engine gap is the first step's.
    const std::string gap = "train/train_rollout_logprob_abs_diff";
    if (metrics.count("train_step/0/train_rollout_logprob_abs_diff"))
      metrics[gap] = metrics["train_step/0/train_rollout_logprob_abs_diff"];
    for (int64_t s = 1; s < n_steps; ++s) metrics.erase(fmt::format("train_step/{}/train_rollout_logprob_abs_diff", s));
  }
  metrics["train/optimizer_steps"] = train_policy ? double(n_steps) : 0.0;
  return metrics;
}

}  // namespace slimpi
