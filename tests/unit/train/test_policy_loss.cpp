// The RL math against the numbers slime's own CPU tests pin (docs/rl_loop.md).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <slimpi/error.h>

#include <cmath>

#include "train/advantages.h"
#include "train/policy_loss.h"

namespace slimpi {
namespace {

at::Tensor vec(std::vector<float> v) { return at::tensor(v, at::kFloat); }

void expect_near(const at::Tensor& got, std::vector<float> want, double tol = 1e-6) {
  ASSERT_EQ(got.numel(), int64_t(want.size()));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i].item<double>(), want[i], tol) << "element " << i;
}

TEST(PolicyLoss, DualClipPinnedBySlime) {
  // ρ = [2, 2, 0.5], A = [2, −2, 2], ε = 0.2, c = 1.5 -> [−2.4, 3.0, −1.0]
  at::Tensor ratio = vec({2, 2, 0.5});
  at::Tensor logp = at::log(ratio), old = at::zeros({3});
  PolicyLossTerms t = ppo_clip_loss(logp, old, vec({2, -2, 2}), 0.2, 0.2, 1.5);
  expect_near(t.loss, {-2.4f, 3.0f, -1.0f}, 1e-5);
  expect_near(t.clipfrac, {1, 0, 0});  // only where the clipped term is the larger
  expect_near(t.ppo_kl, {-std::log(2.0f), -std::log(2.0f), -std::log(0.5f)});
}

TEST(PolicyLoss, WithoutDualClipTheNegativeAdvantageTermIsUnbounded) {
  at::Tensor ratio = vec({2});
  PolicyLossTerms t = ppo_clip_loss(at::log(ratio), at::zeros({1}), vec({-2}), 0.2, 0.2, 0.0);
  expect_near(t.loss, {4.0f}, 1e-5);
}

TEST(PolicyLoss, RatioOneGivesReinforceGradient) {
  // logp == old: ρ = 1, loss = −A, dL/dlogp = −A, ppo_kl = 0.
  at::Tensor logp = vec({-1, -2, -0.5}).requires_grad_(true);
  PolicyLossTerms t = ppo_clip_loss(logp, logp.detach(), vec({0.5, -1, 2}), 0.2, 0.28, 3.0);
  t.loss.sum().backward();
  expect_near(t.loss, {-0.5f, 1.0f, -2.0f});
  expect_near(logp.grad(), {-0.5f, 1.0f, -2.0f});
  EXPECT_EQ(t.ppo_kl.abs().max().item<float>(), 0.0f);
}

TEST(Cispo, ClampPinnedBySlime) {
  expect_near(cispo_clamped_ratio(vec({1, 1.14, 1.56, 0.4}), 0.2, 0.28), {1, 1.14f, 1.28f, 0.8f}, 1e-6);
  expect_near(cispo_clamped_ratio(vec({1, 3, 9, 0.4}), 1.0, 4.0), {1, 3, 5, 0.4f}, 1e-6);
}

TEST(Cispo, GradientFlowsOnlyThroughLogpAndEqualsMinusClampedTimesA) {
  std::vector<float> ratios{1, 1.14f, 1.56f, 0.4f};
  at::Tensor old = vec({-1, -1.5, -0.7, -2});
  at::Tensor logp = (old + at::log(vec(ratios))).detach().requires_grad_(true);
  at::Tensor adv = vec({1, -2, 0.5, 3});
  PolicyLossTerms t = cispo_loss(logp, old, adv, 0.2, 0.28);
  t.loss.sum().backward();
  std::vector<float> clamped{1, 1.14f, 1.28f, 0.8f}, a{1, -2, 0.5f, 3}, want;
  for (int i = 0; i < 4; ++i) want.push_back(-clamped[i] * a[i]);
  expect_near(logp.grad(), want, 1e-5);
  expect_near(t.clipfrac, {0, 0, 1, 1});
}

TEST(Gspo, RatioIsPerSequenceMeanOfLogRatios) {
  // Two sequences: tokens 0-1 and 2-4. Log-ratios 0.1, 0.3 | −0.2, 0, 0.2.
  at::Tensor old = at::zeros({5});
  at::Tensor logp = vec({0.1, 0.3, -0.2, 0, 0.2});
  at::Tensor seg = at::tensor(std::vector<int64_t>{0, 0, 1, 1, 1}, at::kLong);
  PolicyLossTerms t = gspo_loss(logp, old, at::ones({5}), seg, 2, 0.5, 0.5, 0.0);  // no clip at ε 0.5
  const float r0 = std::exp(0.2f), r1 = 1.0f;
  expect_near(t.loss, {-r0, -r0, -r1, -r1, -r1}, 1e-6);
  expect_near(t.ppo_kl, {-0.2f, -0.2f, 0, 0, 0}, 1e-6);
}

TEST(Kl, EstimatorsPinnedBySlime) {
  at::Tensor logp = vec({0.5, 0.7, 0.9}), ref = vec({0.4, 0.5, 0.6});
  expect_near(kl_estimate(logp, ref, "k1"), {0.1f, 0.2f, 0.3f}, 1e-6);
  expect_near(kl_estimate(logp, ref, "k2"), {0.005f, 0.02f, 0.045f}, 1e-6);
  std::vector<float> k3;
  for (float d : {0.1f, 0.2f, 0.3f}) k3.push_back(std::exp(-d) - 1 + d);
  expect_near(kl_estimate(logp, ref, "k3"), k3, 1e-6);
  expect_near(kl_estimate(logp, ref, "low_var_kl"), k3, 1e-6);
  // Only low_var_kl is clamped to [−10, 10]: d = −20 gives e^20 − 21 unclamped.
  at::Tensor far = vec({-20}), zero = vec({0});
  EXPECT_NEAR(kl_estimate(far, zero, "low_var_kl").item<float>(), 10.0f, 1e-6);
  EXPECT_GT(kl_estimate(far, zero, "k3").item<float>(), 1e8f);
  EXPECT_THROW(kl_estimate(far, zero, "k4"), Error);
}

TEST(Rewards, GrpoNormalisationUsesUnbiasedStdPlusEpsilon) {
  std::vector<float> r{1, 0, 0, 1, 0.5, 0.5, 0.5, 0.5};
  std::vector<float> got = postprocess_rewards(advantage_estimators().get("grpo"), r, 4, {});
  const double sd = std::sqrt(1.0 / 3.0);  // unbiased std of {1, 0, 0, 1}
  EXPECT_NEAR(got[0], 0.5 / (sd + 1e-6), 1e-6);
  EXPECT_NEAR(got[1], -0.5 / (sd + 1e-6), 1e-6);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(got[i], 0.0f);  // zero std: centred only
  // std normalisation off: centred only; normalisation off: unchanged.
  EXPECT_NEAR(postprocess_rewards(advantage_estimators().get("grpo"), r, 4, {true, false})[0], 0.5, 1e-7);
  EXPECT_EQ(postprocess_rewards(advantage_estimators().get("grpo"), r, 4, {false, true}), r);
  // reinforce_plus_plus_baseline: centred, never scaled; reinforce_plus_plus: raw.
  EXPECT_NEAR(postprocess_rewards(advantage_estimators().get("reinforce_plus_plus_baseline"), r, 4, {})[0], 0.5, 1e-7);
  EXPECT_EQ(postprocess_rewards(advantage_estimators().get("reinforce_plus_plus"), r, 4, {}), r);
}

// RLOO: each sample's baseline is the mean of its group's other samples; a group's
// advantages sum to 0; never scaled by the std; normalisation off leaves R.
TEST(Rewards, RlooSubtractsTheMeanOfTheOtherSamples) {
  const std::vector<float> r{1, 0, 0, 1, 0.9f, 0.2f, 0.4f, 0.3f};
  const std::vector<float> got = postprocess_rewards(advantage_estimators().get("rloo"), r, 4, {});
  for (int g = 0; g < 2; ++g) {
    double sum = 0;
    for (int i = 0; i < 4; ++i) {
      double others = 0;
      for (int j = 0; j < 4; ++j)
        if (j != i) others += r[size_t(4 * g + j)];
      EXPECT_NEAR(got[size_t(4 * g + i)], r[size_t(4 * g + i)] - others / 3.0, 1e-6) << "group " << g << " sample " << i;
      sum += got[size_t(4 * g + i)];
    }
    EXPECT_NEAR(sum, 0.0, 1e-6) << "group " << g;
  }
  EXPECT_NEAR(got[0], 2.0 / 3.0, 1e-7);  // 1 - (0 + 0 + 1) / 3
  EXPECT_EQ(postprocess_rewards(advantage_estimators().get("rloo"), r, 4, {true, false}), got);  // no std to turn off
  EXPECT_EQ(postprocess_rewards(advantage_estimators().get("rloo"), r, 4, {false, true}), r);
  EXPECT_EQ(postprocess_rewards(advantage_estimators().get("rloo"), {3.0f, -1.0f}, 1, {}), (std::vector<float>{0.0f, 0.0f}));
  AdvantageInputs in;
  in.reward = got[0];
  in.mask = vec({1, 1, 0});
  expect_near(advantage_estimators().get("rloo").advantages(in), {got[0], got[0], got[0]});
}

// ReMax: each group's rewards less its greedy response's (one baseline per group).
TEST(Rewards, RemaxSubtractsTheGreedyResponsesReward) {
  const std::vector<float> r{1, 0, 0, 1, 0.75f, 0.25f};
  EXPECT_EQ(postprocess_rewards(advantage_estimators().get("remax"), r, 3, {}, {1.0f, 0.5f}),
            (std::vector<float>{0, -1, -1, 0.5f, 0.25f, -0.25f}));
  EXPECT_EQ(postprocess_rewards(advantage_estimators().get("remax"), r, 3, {false, true}, {1.0f, 0.5f}), r);  // normalisation off: raw
  EXPECT_EQ(postprocess_rewards(advantage_estimators().get("remax"), {2.0f, 3.0f}, 1, {}, {1.0f, 1.0f}), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_THROW(postprocess_rewards(advantage_estimators().get("remax"), r, 3, {}), Error);              // no baselines
  EXPECT_THROW(postprocess_rewards(advantage_estimators().get("grpo"), r, 3, {}, {1.0f, 0.5f}), Error);  // baselines for another estimator
}

TEST(Rewards, OneSamplePerGroupTurnsStdNormalisationOff) {
  std::vector<float> got = postprocess_rewards(advantage_estimators().get("grpo"), {3.0f, -1.0f}, 1, {});
  EXPECT_EQ(got, (std::vector<float>{0.0f, 0.0f}));  // r − mean of a group of one
}

TEST(Advantages, EstimatorsPerToken) {
  AdvantageInputs in;
  in.reward = 1.5f;
  in.mask = vec({1, 1, 1, 0});
  in.kl = vec({0.1, 0.2, 0.3, 0.4});
  in.kl_coef = 0.5;
  in.gamma = 0.5;
  expect_near(advantage_estimators().get("grpo").advantages(in), {1.5f, 1.5f, 1.5f, 1.5f});
  expect_near(advantage_estimators().get("reinforce_plus_plus_baseline").advantages(in), {1.45f, 1.4f, 1.35f, 1.3f}, 1e-6);
  // token rewards: [−0.05, −0.1, −0.15 + 1.5, 0] ; G = serial discounted sums
  const float r2 = 1.35f, r1 = -0.1f + 0.5f * r2, r0 = -0.05f + 0.5f * r1;
  expect_near(advantage_estimators().get("reinforce_plus_plus").advantages(in), {r0, r1, r2, 0.0f}, 1e-6);
  EXPECT_THROW(advantage_estimators().get("ppo_with_critic").advantages(in), Error);
}

// One row per estimator (train/estimators/): its traits and what it makes of one
// group of rewards. A registered estimator without a row fails here.
struct EstimatorRow {
  const char* name;
  RewardCentring centring;
  const char* policy_loss;
  bool needs_critic, reward_kl, needs_normalized_advantages, own_deck_rules;
  std::vector<float> r;  // postprocess_rewards of {1, 0, 0, 1} in groups of 2 (remax: greedy baselines {1, 0})
};

TEST(Advantages, EveryEstimatorHasItsRow) {
  const float s = float(1 / (std::sqrt(0.5) + 1e-6));  // (R − mean) / (std + 1e-6), std of {1, 0} = sqrt(1/2)
  const std::vector<EstimatorRow> rows = {
      {"grpo", RewardCentring::MeanStd, "ppo_clip", false, false, false, false, {0.5f * s, -0.5f * s, -0.5f * s, 0.5f * s}},
      {"gspo", RewardCentring::MeanStd, "gspo", false, false, false, false, {0.5f * s, -0.5f * s, -0.5f * s, 0.5f * s}},
      {"cispo", RewardCentring::MeanStd, "cispo", false, false, false, false, {0.5f * s, -0.5f * s, -0.5f * s, 0.5f * s}},
      {"rloo", RewardCentring::LeaveOneOut, "ppo_clip", false, false, false, false, {1, -1, -1, 1}},
      {"remax", RewardCentring::Greedy, "ppo_clip", false, false, false, true, {0, -1, 0, 1}},
      {"reinforce_plus_plus", RewardCentring::None, "ppo_clip", false, true, true, false, {1, 0, 0, 1}},
      {"reinforce_plus_plus_baseline", RewardCentring::Mean, "ppo_clip", false, true, true, false, {0.5, -0.5, -0.5, 0.5}},
      {"ppo", RewardCentring::None, "ppo_clip", true, true, false, true, {1, 0, 0, 1}},
  };
  EXPECT_EQ(rows.size(), advantage_estimators().names().size());
  for (const EstimatorRow& row : rows) {
    SCOPED_TRACE(row.name);
    ASSERT_TRUE(advantage_estimators().has(row.name));
    const AdvantageEstimator& e = advantage_estimators().get(row.name);
    EXPECT_EQ(e.name, row.name);
    EXPECT_EQ(e.centring, row.centring);
    EXPECT_EQ(e.policy_loss, row.policy_loss);
    EXPECT_TRUE(policy_losses().has(e.policy_loss));
    EXPECT_EQ(e.needs_critic, row.needs_critic);
    EXPECT_EQ(e.reward_kl, row.reward_kl);
    EXPECT_EQ(e.needs_normalized_advantages, row.needs_normalized_advantages);
    EXPECT_EQ(bool(e.check_deck), row.own_deck_rules);
    const std::vector<float> baselines = e.greedy_baseline() ? std::vector<float>{1, 0} : std::vector<float>{};
    const std::vector<float> r = postprocess_rewards(e, {1, 0, 0, 1}, 2, {}, baselines);
    ASSERT_EQ(r.size(), row.r.size());
    for (size_t i = 0; i < r.size(); ++i) EXPECT_NEAR(r[i], row.r[i], 1e-6) << "sample " << i;
  }
}

TEST(Advantages, DiscountedReturnsMatchTheDefinition) {
  for (double gamma : {0.0, 0.5, 0.99, 1.0})
    for (int64_t T : {1, 127, 128, 129, 1000}) {
      at::Tensor x = at::sin(at::arange(T, at::kDouble));
      at::Tensor g = discounted_returns(x, gamma);
      // check a few positions against the direct sum Σ_k γ^k x_{t+k}
      for (int64_t t : {int64_t(0), T / 2, T - 1}) {
        double direct = 0, w = 1;
        for (int64_t k = t; k < T; ++k, w *= gamma) direct += w * x[k].item<double>();
        EXPECT_NEAR(g[t].item<double>(), direct, 1e-9) << "gamma " << gamma << " T " << T << " t " << t;
      }
    }
}

}  // namespace
}  // namespace slimpi
