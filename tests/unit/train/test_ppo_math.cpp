// PPO's math: GAE and the clipped value loss against slime's functions (numbers from
// slime's ppo_utils.vanilla_gae and loss.value_loss_function on the same inputs), and
// the masked GAE against a recursion written out by hand.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "train/advantages.h"
#include "train/gae.h"
#include "train/value_loss.h"

namespace slimpi {
namespace {

at::Tensor vec(std::vector<float> v) { return at::tensor(v, at::kFloat); }

void expect_near(const at::Tensor& got, std::vector<double> want, double tol = 1e-6) {
  ASSERT_EQ(got.numel(), int64_t(want.size()));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i].item<double>(), want[i], tol) << "element " << i;
}

TEST(Gae, EqualsSlimesVanillaGae) {
  const at::Tensor r = vec({-0.02f, 0.01f, -0.03f, 0.0f, 1.0f}), v = vec({0.5f, 0.4f, 0.6f, 0.3f, 0.8f});
  const at::Tensor ones = at::ones({5});
  // γ 0.9, λ 0.8: slime's vanilla_gae on these rows.
  GaeResult g = generalized_advantages(r, v, ones, 0.9, 0.8);
  expect_near(g.advantages, {-0.0281122, 0.1831776, 0.0460800, 0.5640000, 0.2000000});
  expect_near(g.returns, {0.4718878, 0.5831776, 0.6460800, 0.8640000, 1.0000000});
  // slime's defaults γ = λ = 1: the returns are the reward-to-go, whatever the values.
  g = generalized_advantages(r, v, ones, 1.0, 1.0);
  expect_near(g.advantages, {0.46, 0.58, 0.37, 0.70, 0.20});
  expect_near(g.returns, {0.96, 0.98, 0.97, 1.00, 1.00});
}

TEST(Gae, MaskedTokensAreSkippedAndCarryTheirRewardBack) {
  // Counted tokens 0, 2, 3 (1 and 4 are an environment's): the recursion runs over 0 -> 2
  // -> 3; the reward on token 4 goes to token 3, the one on token 1 to token 0.
  const double gamma = 0.9, lambd = 0.7;
  const at::Tensor r = vec({0.1f, 0.2f, -0.3f, 0.4f, 1.0f}), v = vec({0.5f, 9.0f, 0.25f, -0.5f, 7.0f});
  const at::Tensor m = vec({1, 0, 1, 1, 0});
  const GaeResult g = generalized_advantages(r, v, m, gamma, lambd);
  const double d3 = (0.4 + 1.0) + gamma * 0.0 - (-0.5);
  const double a3 = d3;
  const double d2 = -0.3 + gamma * (-0.5) - 0.25;
  const double a2 = d2 + gamma * lambd * a3;
  const double d0 = (0.1 + 0.2) + gamma * 0.25 - 0.5;
  const double a0 = d0 + gamma * lambd * a2;
  expect_near(g.advantages, {a0, 0.0, a2, a3, 0.0}, 1e-6);
  expect_near(g.returns, {a0 + 0.5, 9.0, a2 + 0.25, a3 - 0.5, 7.0}, 1e-6);
}

TEST(Gae, PpoEstimatorShapesTheRewardWithTheKlOnTheLastCountedToken) {
  AdvantageInputs in;
  in.reward = 1.0f;
  in.mask = vec({1, 1, 1, 0});
  in.kl = vec({0.1f, -0.2f, 0.3f, 5.0f});
  in.kl_coef = 0.5;
  in.gamma = 0.9;
  in.lambd = 0.8;
  in.values = vec({0.2f, 0.1f, 0.4f, 3.0f});
  // r_t = −0.5·kl_t on counted tokens, + 1 on token 2 (the last counted).
  expect_near(token_rewards(in), {-0.05, 0.1, 0.85, 0.0}, 1e-6);
  const GaeResult want = generalized_advantages(vec({-0.05f, 0.1f, 0.85f, 0.0f}), in.values, in.mask, 0.9, 0.8);
  expect_near(advantage_estimators().get("ppo").advantages(in), {want.advantages[0].item<double>(), want.advantages[1].item<double>(),
                                              want.advantages[2].item<double>(), 0.0});
  EXPECT_TRUE(advantage_estimators().get("ppo").needs_critic);
  EXPECT_FALSE(advantage_estimators().get("grpo").needs_critic);
  EXPECT_EQ(postprocess_rewards(advantage_estimators().get("ppo"), {1.0f, 0.0f, 0.5f, 0.5f}, 2, {}), (std::vector<float>{1.0f, 0.0f, 0.5f, 0.5f}));
}

TEST(ValueLoss, EqualsSlimesClippedValueLoss) {
  // slime's value_loss_function per token, value_clip 0.2.
  const at::Tensor v = vec({0.5f, 1.0f, -0.3f, 2.0f, 0.0f}), old = vec({0.4f, 0.5f, 0.0f, 2.1f, 1.0f});
  const at::Tensor ret = vec({1.0f, 0.2f, -1.0f, 1.5f, 0.1f});
  const ValueLossTerms t = value_loss_terms(v, old, ret, 0.2);
  // Token 4: the clipped value 0.8 is further from the return than 0.0 is: its square counts.
  expect_near(t.loss, {0.25, 0.64, 0.64, 0.25, 0.49}, 1e-6);
  expect_near(t.clipped, {0, 1, 1, 0, 1});
}

TEST(ValueLoss, GradientFlowsOnlyThroughTheLargerTerm) {
  at::Tensor v = vec({1.0f, 0.0f}).requires_grad_(true);
  const ValueLossTerms t = value_loss_terms(v, vec({0.5f, 1.0f}), vec({0.2f, 0.1f}), 0.2);
  t.loss.sum().backward();
  // Token 0: (V − G)² wins, d/dV = 2(1 − 0.2) = 1.6; token 1: the clipped term wins and
  // its V − V_old is clamped: no gradient.
  expect_near(v.grad(), {1.6, 0.0}, 1e-6);
}

}  // namespace
}  // namespace slimpi
