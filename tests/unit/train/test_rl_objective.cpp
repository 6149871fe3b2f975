// The micro-batch objective (train/rl_objective.h) without a model: slime's pinned
// policy-loss numbers through the reducer weights, the entropy and KL terms, the TIS
// weight, and the gradient that reaches the log-probs.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "train/metric_sums.h"
#include "train/rl_objective.h"
#include "train/trainer_config.h"

namespace slimpi {
namespace {

at::Tensor vec(std::vector<float> v) { return at::tensor(v, at::kFloat); }

// One sample of three response tokens, weights 1/3 each (per-rollout mean).
ScoredMicroBatch one_sample(const at::Tensor& logp, const at::Tensor& old, const at::Tensor& advantages) {
  ScoredMicroBatch b;
  b.logp = logp;
  b.entropy = vec({1.0f, 2.0f, 3.0f});
  b.mask = at::ones({3});
  b.weight = b.mask / 3.0;
  b.old_logp = old;
  b.advantages = advantages;
  b.sample_of_token = at::zeros({3}, at::kLong);
  b.n_samples = 1;
  return b;
}

TEST(RlObjective, DualClipPinnedBySlimeThroughTheReducer) {
  // ρ = [2, 2, 0.5], A = [2, −2, 2], ε = 0.2, c = 1.5 -> per token [−2.4, 3.0, −1.0] (slime).
  TrainerConfig cfg;
  cfg.eps_clip_c = 1.5;
  const at::Tensor logp = at::log(vec({2, 2, 0.5}));
  MetricSums sums;
  const at::Tensor loss = rl_objective(cfg, one_sample(logp, at::zeros({3}), vec({2, -2, 2})), sums);
  const double pg = (-2.4 + 3.0 - 1.0) / 3.0;
  EXPECT_NEAR(loss.item<double>(), pg, 1e-6);  // no entropy or KL term by default
  const auto m = sums.reduce(nullptr);
  EXPECT_NEAR(m.at("train/pg_loss"), pg, 1e-6);
  EXPECT_NEAR(m.at("train/pg_clipfrac"), 1.0 / 3.0, 1e-6);
  EXPECT_NEAR(m.at("train/ppo_kl"), -std::log(2.0) / 3.0, 1e-6);
  EXPECT_NEAR(m.at("train/entropy_loss"), 2.0, 1e-6);
  EXPECT_NEAR(m.at("train/loss"), pg, 1e-6);
  EXPECT_EQ(m.count("train/train_rollout_logprob_abs_diff"), 0u);  // no engine log-probs
}

TEST(RlObjective, EntropyAndKlLossTerms) {
  // L = pg − entropy_coef · mean H + kl_loss_coef · mean k1(logp, ref); k1 = logp − ref.
  TrainerConfig cfg;
  cfg.entropy_coef = 0.1;
  cfg.use_kl_loss = true;
  cfg.kl_loss_coef = 0.5;
  cfg.kl_loss_type = "k1";
  const at::Tensor logp = vec({-1, -2, -0.5});
  ScoredMicroBatch b = one_sample(logp, logp, vec({0.5, -1, 2}));  // ρ = 1: pg = −A
  b.ref_logp = logp - vec({0.1f, 0.2f, 0.3f});
  MetricSums sums;
  const at::Tensor loss = rl_objective(cfg, b, sums);
  const double pg = -(0.5 - 1 + 2) / 3.0, entropy = 2.0, kl = 0.2;
  EXPECT_NEAR(loss.item<double>(), pg - 0.1 * entropy + 0.5 * kl, 1e-6);
  const auto m = sums.reduce(nullptr);
  EXPECT_NEAR(m.at("train/kl_loss"), kl, 1e-6);
  EXPECT_NEAR(m.at("train/loss"), pg - 0.1 * entropy + 0.5 * kl, 1e-6);
}

TEST(RlObjective, GradientAtRatioOneIsMinusAdvantageTimesWeight) {
  TrainerConfig cfg;
  const at::Tensor logp = vec({-1, -2, -0.5}).requires_grad_(true);
  ScoredMicroBatch b = one_sample(logp, logp.detach(), vec({0.5, -1, 2}));
  b.entropy = at::zeros({3});
  MetricSums sums;
  rl_objective(cfg, b, sums).backward();
  const std::vector<float> want{-0.5f / 3, 1.0f / 3, -2.0f / 3};
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(logp.grad()[i].item<float>(), want[size_t(i)], 1e-6) << i;
}

TEST(RlObjective, VanillaTisClampsTheEngineRatio) {
  // old − rollout = ln 4 on every token: ρ_tis = 4, clamped to tis_clip = 2, so the
  // policy-gradient term doubles; train_rollout_logprob_abs_diff = ln 4.
  TrainerConfig cfg;
  cfg.use_tis = true;
  const at::Tensor logp = vec({-1, -2, -0.5});
  ScoredMicroBatch b = one_sample(logp, logp, vec({0.5, -1, 2}));
  b.entropy = at::zeros({3});
  b.rollout_logp = logp - std::log(4.0f);
  MetricSums sums;
  const at::Tensor loss = rl_objective(cfg, b, sums);
  EXPECT_NEAR(loss.item<double>(), 2.0 * -(0.5 - 1 + 2) / 3.0, 1e-6);
  const auto m = sums.reduce(nullptr);
  EXPECT_NEAR(m.at("train/train_rollout_logprob_abs_diff"), std::log(4.0), 1e-6);
  EXPECT_NEAR(m.at("train/ois"), 1.0, 1e-6);  // ρ of the policy loss itself is 1
}

TEST(SftObjective, MeanNegativeLogLikelihood) {
  ScoredMicroBatch b;
  b.logp = vec({-1, -2, -3});
  b.entropy = at::zeros({3});
  b.mask = vec({1, 1, 0});
  b.weight = b.mask / 2.0;
  MetricSums sums;
  EXPECT_NEAR(sft_objective(b, sums).item<double>(), 1.5, 1e-6);
  EXPECT_NEAR(sums.reduce(nullptr).at("train/loss"), 1.5, 1e-6);
}

}  // namespace
}  // namespace slimpi
