// The micro-batch loss as a list of terms (train/loss/loss_term.h): which terms a
// configuration builds, in slime's order, and terms evaluated on a micro-batch view made
// of tensors alone (no Trainer): the SFT term's Σ −logp·w, the policy objective's
// rl_objective, each adding itself to the loss so far.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/transformer.h"
#include "train/loss/loss_term.h"
#include "train/metric_sums.h"
#include "train/packed_batch.h"
#include "train/rl_objective.h"
#include "train/trainer_config.h"
#include "../../support/tiny_model.h"

namespace slimpi {
namespace {

std::vector<std::string> names(const LossTerms& terms) {
  std::vector<std::string> out;
  for (const auto& t : terms) out.push_back(t->name());
  return out;
}

TEST(LossTerms, EachConfigurationBuildsItsTermsInSlimesOrder) {
  ModelConfig dense = testing::tiny_model_config(64, 0.02);
  ModelConfig moe_mtp = dense;
  moe_mtp.n_experts = 4;
  moe_mtp.n_experts_per_tok = 2;
  moe_mtp.moe_intermediate_size = 16;
  moe_mtp.mtp_num_layers = 1;
  const Transformer dense_model(dense, 1, at::kCPU), moe_model(moe_mtp, 1, at::kCPU);
  TrainerConfig sft;
  EXPECT_EQ(names(build_loss_terms(sft, dense_model)), (std::vector<std::string>{"sft"}));
  TrainerConfig rl;
  rl.mode = "rl";
  EXPECT_EQ(names(build_loss_terms(rl, dense_model)), (std::vector<std::string>{"policy_objective"}));
  // MTP layers with train.mtp_loss_coef = 0: a frozen draft, no term
  rl.mtp_loss_coef = 0;
  EXPECT_EQ(names(build_loss_terms(rl, moe_model)), (std::vector<std::string>{"policy_objective", "router_losses"}));
  rl.mtp_loss_coef = 0.1;
  rl.opd_topk_loss_coef = 0.5;
  EXPECT_EQ(names(build_loss_terms(rl, moe_model)),
            (std::vector<std::string>{"policy_objective", "opd_topk", "router_losses", "mtp"}));
  sft.mtp_loss_coef = 0.1;
  sft.opd_topk_loss_coef = 0.5;  // an RL term: not in SFT
  EXPECT_EQ(names(build_loss_terms(sft, moe_model)), (std::vector<std::string>{"sft", "router_losses", "mtp"}));
}

TEST(LossTerms, TermsAreFunctionsOfTheMicroBatchView) {
  const Transformer model(testing::tiny_model_config(64, 0.02), 1, at::kCPU);
  ScoredMicroBatch scored;
  scored.logp = at::tensor(std::vector<float>{-1.0f, -2.0f, -0.5f}).set_requires_grad(true);  // [N]
  scored.entropy = at::tensor(std::vector<float>{1.0f, 2.0f, 3.0f});
  scored.mask = at::ones({3});
  scored.weight = at::tensor(std::vector<float>{0.5f, 0.25f, 0.25f});
  scored.old_logp = scored.logp.detach();
  scored.advantages = at::tensor(std::vector<float>{1.0f, -1.0f, 2.0f});
  scored.sample_of_token = at::zeros({3}, at::kLong);
  scored.n_samples = 1;
  const std::vector<Sample> local(1);
  const std::vector<int64_t> which{0};
  const PackedBatch batch;
  const at::Tensor hidden;
  const MicroBatchView mb{local, which, batch, scored, hidden};

  TrainerConfig sft;
  const LossTerms sft_terms = build_loss_terms(sft, model);
  MetricSums sums;
  for (const auto& t : sft_terms) t->declare_metrics(sums);
  at::Tensor loss;
  for (const auto& t : sft_terms) loss = t->add_to(loss, mb, sums);
  EXPECT_NEAR(loss.item<double>(), 0.5 * 1.0 + 0.25 * 2.0 + 0.25 * 0.5, 1e-6);  // Σ −logp·w
  loss.backward();
  EXPECT_TRUE(at::allclose(scored.logp.grad(), -scored.weight));

  TrainerConfig rl;
  rl.mode = "rl";
  rl.entropy_coef = 0.1;
  const LossTerms rl_terms = build_loss_terms(rl, model);
  MetricSums term_sums, direct_sums;
  for (const auto& t : rl_terms) t->declare_metrics(term_sums);
  at::Tensor rl_loss;
  for (const auto& t : rl_terms) rl_loss = t->add_to(rl_loss, mb, term_sums);
  const at::Tensor direct = rl_objective(rl, scored, direct_sums);
  EXPECT_EQ(rl_loss.item<double>(), direct.item<double>());  // the same operations: equal bit for bit
  const auto declared = term_sums.reduce(nullptr), added = direct_sums.reduce(nullptr);
  for (const auto& [k, v] : added) {
    ASSERT_TRUE(declared.count(k)) << k << " added but not declared";
    EXPECT_EQ(declared.at(k), v) << k;
  }
}

}  // namespace
}  // namespace slimpi
