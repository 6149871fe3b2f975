// The PPO critic on one rank: it learns the expected return of a task whose reward
// ignores the tokens, a sample's values do not depend on its batch mates, the trainer's
// rollout preparation fills values, returns and GAE advantages, and a checkpoint resumes
// the critic bit for bit.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "train/gae.h"
#include "train/trainer.h"
#include "../../support/tiny_model.h"

namespace slimpi {
namespace {

ModelConfig critic_model() { return testing::tiny_model_config(32, 0.02); }

TrainerConfig ppo_config() {
  TrainerConfig c;
  c.mode = "rl";
  c.estimator = &advantage_estimators().get("ppo");
  c.lr.lr = 1e-3;
  c.critic.lr.lr = 3e-3;
  c.critic.seed = 7;
  c.gamma = 1.0;
  c.lambd = 1.0;
  c.lambd_value = 1.0;
  return c;
}

// n samples of random tokens; rewards Bernoulli(p) from the generator, whatever the tokens.
std::vector<Sample> coin_rollout(int n, double p, at::Generator& g) {
  std::vector<Sample> out;
  for (int i = 0; i < n; ++i) {
    Sample s;
    const int64_t len = 6 + at::randint(8, {1}, g, at::kLong).item<int64_t>();
    const at::Tensor t = at::randint(259, {len}, g, at::kLong);
    s.tokens.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + len);
    s.prompt_length = 2 + i % 3;
    s.reward = at::rand({1}, g).item<double>() < p ? 1.0f : 0.0f;
    out.push_back(s);
  }
  return out;
}

TEST(Critic, LearnsTheMeanRewardOfATaskWhoseRewardIgnoresTheTokens) {
  Transformer policy(critic_model(), 3, at::kCPU);
  TrainerConfig cfg = ppo_config();
  Trainer trainer(cfg, policy, nullptr);
  ASSERT_NE(trainer.critic(), nullptr);
  at::Generator g = at::detail::createCPUGenerator(11);
  double first_loss = 0, last_means = 0;
  const int rollouts = 200, tail = 50;
  for (int k = 0; k < rollouts; ++k) {
    std::vector<Sample> batch = coin_rollout(32, 0.3, g);
    auto prep = trainer.prepare_rollout(batch, false);
    for (const auto& s : batch) {  // γ = λ = 1, no KL: every token's return is the sample's reward
      ASSERT_EQ(int64_t(s.returns.size()), s.response_length());
      for (float x : s.returns) EXPECT_NEAR(x, s.reward, 1e-6);
    }
    auto m = trainer.critic()->train_step(batch);
    if (k == 0) first_loss = m.at("train/value_loss");
    if (k >= rollouts - tail) last_means += prep.at("train/values_mean") / tail;
  }
  EXPECT_NEAR(last_means, 0.3, 0.05);
  // A fresh rollout's values, token by token, sit near the expected return too.
  std::vector<Sample> fresh = coin_rollout(32, 0.3, g);
  double sum = 0, n = 0;
  for (const auto& v : trainer.critic()->values(fresh))
    for (float x : v) sum += x, n += 1;
  EXPECT_NEAR(sum / n, 0.3, 0.06);
  // The value loss fell to about the reward's variance, p(1 − p) = 0.21.
  std::vector<Sample> check = coin_rollout(64, 0.3, g);
  trainer.prepare_rollout(check, false);
  EXPECT_LT(trainer.critic()->train_step(check).at("train/value_loss"), first_loss);
}

TEST(Critic, ValuesOfASampleDoNotDependOnItsBatchMates) {
  Transformer policy(critic_model(), 3, at::kCPU);
  TrainerConfig cfg = ppo_config();
  cfg.n_micro_batches = 1;
  Trainer trainer(cfg, policy, nullptr);
  at::Generator g = at::detail::createCPUGenerator(5);
  std::vector<Sample> batch = coin_rollout(6, 0.5, g);
  const auto together = trainer.critic()->values(batch);
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto alone = trainer.critic()->values({batch[i]});
    ASSERT_EQ(int64_t(alone[0].size()), batch[i].response_length());
    for (size_t t = 0; t < alone[0].size(); ++t) EXPECT_NEAR(alone[0][t], together[i][t], 1e-5);
  }
}

TEST(Critic, RolloutPreparationGivesGaeAdvantagesOverTheCriticsValues) {
  Transformer policy(critic_model(), 3, at::kCPU);
  TrainerConfig cfg = ppo_config();
  cfg.gamma = 0.95;
  cfg.lambd = 0.9;
  cfg.lambd_value = 0.6;
  Trainer trainer(cfg, policy, nullptr);
  at::Generator g = at::detail::createCPUGenerator(9);
  std::vector<Sample> batch = coin_rollout(4, 0.5, g);
  batch[1].loss_mask.assign(size_t(batch[1].response_length()), 1.0f);
  batch[1].loss_mask[1] = 0.0f;
  auto m = trainer.prepare_rollout(batch, false);
  for (const auto& s : batch) {
    const at::Tensor mask = s.loss_mask.empty() ? at::ones({s.response_length()}) : at::tensor(s.loss_mask);
    at::Tensor r = at::zeros({s.response_length()});
    r[at::nonzero(mask).flatten()[-1].item<int64_t>()] = s.reward;
    const at::Tensor v = at::tensor(s.values);
    const GaeResult policy_gae = generalized_advantages(r, v, mask, 0.95, 0.9);
    const GaeResult value_gae = generalized_advantages(r, v, mask, 0.95, 0.6);
    EXPECT_TRUE(at::allclose(at::tensor(s.raw_advantages), policy_gae.advantages, 1e-6, 1e-6));
    EXPECT_TRUE(at::allclose(at::tensor(s.returns), value_gae.returns, 1e-6, 1e-6));
  }
  for (const char* k : {"train/values_mean", "train/returns_mean", "train/explained_variance"})
    EXPECT_TRUE(m.count(k) && std::isfinite(m.at(k))) << k;
}

TEST(Critic, SaveLoadResumesTheCriticBitForBit) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("slimpi_critic_" + std::to_string(::getpid()) + ".h5")).string();
  TrainerConfig cfg = ppo_config();
  cfg.critic.weight_decay = 0.01;
  at::Generator g = at::detail::createCPUGenerator(21);
  std::vector<std::vector<Sample>> rollouts;
  for (int k = 0; k < 3; ++k) rollouts.push_back(coin_rollout(8, 0.4, g));
  auto run_rollout = [](Trainer& t, std::vector<Sample> batch) {
    t.prepare_rollout(batch, false);
    t.critic()->train_step(batch);
    t.critic()->end_rollout();
    return t.train_step(batch);
  };

  Transformer straight(critic_model(), 4, at::kCPU);
  Trainer a(cfg, straight, nullptr);
  for (const auto& r : rollouts) run_rollout(a, r);

  Transformer first(critic_model(), 4, at::kCPU);
  Trainer b(cfg, first, nullptr);
  run_rollout(b, rollouts[0]);
  run_rollout(b, rollouts[1]);
  b.save(path);

  Transformer resumed(critic_model(), 99, at::kCPU);  // another init: everything must come from the file
  TrainerConfig other = cfg;
  other.critic.seed = 1234;  // another fresh head too
  Trainer c(other, resumed, nullptr);
  c.load(path);
  EXPECT_EQ(c.critic()->n_steps(), 2);
  EXPECT_EQ(c.critic()->n_rollouts(), 2);
  run_rollout(c, rollouts[2]);
  const auto& want = a.critic()->parameters();
  const auto& got = c.critic()->parameters();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(at::equal(want[i].tensor, got[i].tensor)) << want[i].name;
  for (size_t i = 0; i < straight.parameters().size(); ++i)
    EXPECT_TRUE(at::equal(straight.parameters()[i].tensor, resumed.parameters()[i].tensor))
        << straight.parameters()[i].name;
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace slimpi
