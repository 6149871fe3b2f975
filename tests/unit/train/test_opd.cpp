// On-policy distillation in the trainer's rollout preparation: a teacher equal to the
// student gives zero reverse KL and the advantages of no teacher at all; another teacher
// shifts each token's advantage by −opd_kl_coef·(logp_old − logp_teacher) before
// whitening (slime's apply_opd_kl_to_advantages), over the whole vocabulary whatever the
// sampling support; pure distillation leaves the task reward out.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include "train/trainer.h"
#include "../../support/tiny_model.h"

namespace slimpi {
namespace {

ModelConfig opd_model() { return testing::tiny_model_config(32, 0.1); }

TrainerConfig grpo_config() {
  TrainerConfig c;
  c.mode = "rl";
  c.lr.lr = 1e-3;
  return c;
}

std::vector<Sample> rollout(int n, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  std::vector<Sample> out;
  for (int i = 0; i < n; ++i) {
    Sample s;
    const int64_t len = 6 + at::randint(8, {1}, g, at::kLong).item<int64_t>();
    const at::Tensor t = at::randint(259, {len}, g, at::kLong);
    s.tokens.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + len);
    s.prompt_length = 2;
    s.reward = float(i % 3) - 1.0f;
    out.push_back(s);
  }
  return out;
}

TEST(Opd, ATeacherEqualToTheStudentChangesNothing) {
  Transformer student(opd_model(), 3, at::kCPU), plain_student(opd_model(), 3, at::kCPU);
  Transformer teacher(opd_model(), 3, at::kCPU);  // the same seed: the same weights
  TrainerConfig cfg = grpo_config();
  cfg.opd_kl_coef = 1.0;
  Trainer with(cfg, student, nullptr);
  with.set_teacher(&teacher);
  Trainer without(grpo_config(), plain_student, nullptr);
  std::vector<Sample> a = rollout(6, 1), b = a;
  auto m = with.prepare_rollout(a, /*recompute_old=*/true);
  without.prepare_rollout(b, /*recompute_old=*/true);
  EXPECT_EQ(m.at("train/opd_reverse_kl"), 0.0);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].teacher_log_probs, a[i].old_log_probs);
    EXPECT_EQ(a[i].advantages, b[i].advantages);
  }
}

TEST(Opd, AnotherTeacherShiftsEachTokensAdvantageByTheReverseKl) {
  Transformer student(opd_model(), 3, at::kCPU), teacher(opd_model(), 4, at::kCPU);
  for (const bool task_reward : {true, false}) {
    TrainerConfig cfg = grpo_config();
    cfg.opd_kl_coef = 0.5;
    cfg.opd_task_reward = task_reward;
    Trainer trainer(cfg, student, nullptr);
    trainer.set_teacher(&teacher);
    std::vector<Sample> samples = rollout(6, 2);
    samples[0].sampling_support.assign(size_t(samples[0].response_length()), 3);  // drawn from a top-3 set
    auto m = trainer.prepare_rollout(samples, /*recompute_old=*/false);
    double kl_mean = 0;
    for (const auto& s : samples) {
      // The teacher's log-probs over the whole vocabulary, alone.
      at::NoGradGuard no_grad;
      const at::Tensor tokens = at::tensor(s.tokens, at::kLong);
      const at::Tensor logits = teacher.forward_packed(tokens, {int64_t(s.tokens.size())});
      const at::Tensor want = at::log_softmax(logits, -1)
                                  .narrow(0, s.prompt_length - 1, s.response_length())
                                  .gather(1, tokens.narrow(0, s.prompt_length, s.response_length()).unsqueeze(1))
                                  .squeeze(1);
      ASSERT_EQ(int64_t(s.teacher_log_probs.size()), s.response_length());
      EXPECT_TRUE(at::allclose(at::tensor(s.teacher_log_probs), want, 1e-4, 1e-5));
      double d_sum = 0;
      for (int64_t t = 0; t < s.response_length(); ++t) {
        const double d = double(s.old_log_probs[t]) - double(s.teacher_log_probs[t]);
        EXPECT_NEAR(s.raw_advantages[t], (task_reward ? s.reward : 0.0) - 0.5 * d, 1e-6);
        d_sum += d;
      }
      kl_mean += d_sum / double(s.response_length()) / double(samples.size());
    }
    EXPECT_NEAR(m.at("train/opd_reverse_kl"), kl_mean, 1e-6);
    EXPECT_GT(std::abs(kl_mean), 1e-3);
  }
}

// The top-k distillation loss: with a teacher equal to the student and no reward, the
// policy-gradient term is zero and the step's gradient is the top-k loss's alone, which
// equals Σ_i (1/n) mean_t Σ_{j ∈ top-k} q_j (log q_j − log softmax(z_t / T)[j]) taken by
// hand through a plain forward; its value −log P_top-k per token.
TEST(Opd, TopKLossGradientIsTheKlFromTheTeachersTopKThroughTheStudentsSoftmax) {
  const double T = 0.8;
  const int64_t k = 4;
  TrainerConfig cfg = grpo_config();
  cfg.opd_kl_coef = 1.0;
  cfg.opd_topk_loss_coef = 0.7;
  cfg.opd_top_k = k;
  cfg.temperature = T;
  cfg.clip_grad = 0.0;
  cfg.lr.lr = 0.0;
  cfg.n_micro_batches = 2;
  Transformer student(opd_model(), 3, at::kCPU), teacher(opd_model(), 3, at::kCPU), by_hand(opd_model(), 3, at::kCPU);
  Trainer trainer(cfg, student, nullptr);
  trainer.set_teacher(&teacher);
  std::vector<Sample> samples = rollout(5, 6);
  for (auto& s : samples) s.reward = 0.0f;
  trainer.prepare_rollout(samples, /*recompute_old=*/false);
  auto m = trainer.train_step(samples);

  double want_kl = 0;
  for (const auto& s : samples) {
    const at::Tensor tokens = at::tensor(s.tokens, at::kLong);
    const int64_t R = s.response_length();
    const at::Tensor z = by_hand.forward_packed(tokens, {int64_t(s.tokens.size())}).narrow(0, s.prompt_length - 1, R) / T;
    const at::Tensor lsm = at::log_softmax(z, -1);  // [R, V]
    auto [top_z, ids] = z.detach().topk(k, 1);
    const at::Tensor q = at::softmax(top_z, 1);  // [R, k]
    const at::Tensor kl = (q * (q.log() - lsm.gather(1, ids))).sum(1);  // [R]
    ((cfg.opd_topk_loss_coef * kl.mean()) / double(samples.size())).backward();
    want_kl += kl.mean().item<double>() / double(samples.size());
    // Each token's KL is −log of the student's mass on the top-k (teacher = student).
    const at::Tensor mass = at::exp(lsm.detach().gather(1, ids)).sum(1);
    EXPECT_TRUE(at::allclose(kl.detach(), -mass.log(), 1e-5, 1e-6));
  }
  EXPECT_NEAR(m.at("train/opd_topk_kl"), want_kl, 1e-5);
  EXPECT_GT(want_kl, 1e-3);
  for (size_t i = 0; i < student.parameters().size(); ++i) {
    const at::Tensor& got = student.parameters()[i].tensor.grad();
    const at::Tensor& want = by_hand.parameters()[i].tensor.grad();
    EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-6)) << student.parameters()[i].name << " max |diff| "
                                                    << (got - want).abs().max().item<double>();
  }
}

}  // namespace
}  // namespace slimpi
