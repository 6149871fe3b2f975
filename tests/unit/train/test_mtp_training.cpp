// Training the multi-token-prediction layers beside the policy (train/mtp_loss.h): the
// positions each depth counts; the MTP loss leaves every trunk gradient and weight bit
// for bit as without it, and a frozen draft (train.mtp_loss_coef = 0) is never
// updated; each depth's logged loss is its cross-entropy (or distillation) computed by
// hand from the model; and the MTP layers learn.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include "arch/mtp_names.h"
#include "train/mtp_loss.h"
#include "train/trainer.h"
#include "../../support/tiny_model.h"

namespace slimpi {
namespace {

ModelConfig mtp_model(int64_t depths) {
  ModelConfig c = testing::tiny_model_config(48, 0.1);
  c.mtp_num_layers = depths;
  return c;
}

std::vector<Sample> samples(int n, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  std::vector<Sample> out;
  for (int i = 0; i < n; ++i) {
    Sample s;
    const int64_t len = 10 + at::randint(12, {1}, g, at::kLong).item<int64_t>();
    at::Tensor t = at::randint(259, {len}, g, at::kLong);
    s.tokens.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + len);
    s.prompt_length = 2 + i % 3;
    out.push_back(s);
  }
  return out;
}

TrainerConfig sft(double mtp_coef, const std::string& kind = "ce") {
  TrainerConfig c;
  c.mode = "sft";
  c.lr.lr = 1e-2;
  c.n_micro_batches = 2;
  c.clip_grad = 0.5;
  c.adam.weight_decay = 0.1;
  c.mtp_loss_coef = mtp_coef;
  c.mtp_loss = kind;
  c.mtp_distill_top_k = 5;
  return c;
}

TEST(MtpLoss, CountedPositionsNeedAGeneratedInputAndTarget) {
  EXPECT_EQ(mtp_counted_positions(3, 8, {}, 0), 4);  // targets at 4..7, inputs at 3..6
  EXPECT_EQ(mtp_counted_positions(3, 8, {}, 2), 4);
  EXPECT_EQ(mtp_counted_positions(1, 4, {}, 2), 0);  // depth 2 reads position q - 4 >= 0: q >= 4
  EXPECT_EQ(mtp_counted_positions(3, 8, {1, 1, 0, 1, 1}, 0), 2);  // masked tokens neither read nor predicted
  EXPECT_EQ(mtp_counted_positions(5, 5, {}, 0), 0);
}

TEST(MtpLoss, TheTrunkGetsThePolicyGradientAloneAndAFrozenDraftNeverMoves) {
  Transformer trained(mtp_model(2), 4, at::kCPU), frozen(mtp_model(2), 4, at::kCPU);
  Trainer a(sft(0.2), trained, nullptr), b(sft(0.0), frozen, nullptr);
  std::map<std::string, at::Tensor> start;
  for (const auto& p : frozen.parameters()) start[p.name] = p.tensor.detach().clone();
  for (int step = 0; step < 3; ++step) {
    auto sa = samples(5, 10 + step), sb = samples(5, 10 + step);
    const auto ma = a.train_step(sa), mb = b.train_step(sb);
    EXPECT_EQ(ma.at("train/loss"), mb.at("train/loss"));
    EXPECT_EQ(ma.at("train/grad_norm"), mb.at("train/grad_norm"));  // the trunk's norm: the MTP layers apart
    EXPECT_GT(ma.at("train/mtp_loss"), 0.0);
    EXPECT_GT(ma.at("train/mtp_grad_norm"), 0.0);
    EXPECT_FALSE(mb.count("train/mtp_loss"));
    for (const auto& p : trained.parameters()) {
      if (is_mtp_parameter(p.name)) continue;
      EXPECT_TRUE(at::equal(p.tensor.grad(), frozen.parameter(p.name).grad())) << "gradient of " << p.name;
      EXPECT_TRUE(at::equal(p.tensor, frozen.parameter(p.name))) << p.name;
    }
  }
  for (const auto& p : frozen.parameters())
    if (is_mtp_parameter(p.name)) {
      EXPECT_TRUE(at::equal(p.tensor, start.at(p.name))) << "frozen " << p.name;
      EXPECT_FALSE(at::equal(trained.parameter(p.name), start.at(p.name))) << "trained " << p.name;
    }
}

// Each depth's loss by hand: the trunk's hidden states, the depth's forward, and the
// cross-entropy (or the distillation against the policy's top-k) over the counted positions.
void expect_hand_losses(const std::string& kind) {
  Transformer model(mtp_model(2), 6, at::kCPU);
  std::vector<Sample> batch = samples(3, 21);
  std::vector<double> want(2, 0.0), count(2, 0.0);
  {
    at::NoGradGuard no_grad;
    for (const Sample& s : batch) {
      const int64_t L = int64_t(s.tokens.size()), P = s.prompt_length;
      const at::Tensor x = at::tensor(s.tokens, at::kLong);
      at::Tensor in = model.forward_packed_hidden(x, {L});
      const at::Tensor trunk_logits = model.head_logits(in);  // [L, V]
      for (int64_t i = 0; i < 2; ++i) {
        const at::Tensor next = at::cat({x.narrow(0, i + 1, L - i - 1), at::zeros({i + 1}, at::kLong)});
        const at::Tensor h = model.forward_mtp_packed(i, in, next, {L});
        const at::Tensor logp = at::log_softmax(model.head_logits(h), 1);  // [L, V]
        for (int64_t q = std::max(P + 1, i + 2); q < L; ++q) {
          const int64_t row = q - i - 2;
          if (kind == "ce") {
            want[size_t(i)] -= logp[row][s.tokens[size_t(q)]].item<double>();
          } else {
            auto [top, ids] = trunk_logits[row + i + 1].topk(5);
            const at::Tensor qd = at::softmax(top, 0);
            want[size_t(i)] -= (qd * logp[row].index_select(0, ids)).sum().item<double>();
          }
          count[size_t(i)] += 1;
        }
        in = h;
      }
    }
  }
  Transformer same(mtp_model(2), 6, at::kCPU);
  Trainer trainer(sft(0.3, kind), same, nullptr);
  const auto m = trainer.train_step(batch);
  for (int64_t i = 0; i < 2; ++i)
    EXPECT_NEAR(m.at("train/mtp_" + std::to_string(i + 1) + "_loss"), want[size_t(i)] / count[size_t(i)], 1e-5)
        << kind << " depth " << i;
  EXPECT_NEAR(m.at("train/mtp_loss"), (want[0] / count[0] + want[1] / count[1]) / 2, 1e-5) << kind;
}

TEST(MtpLoss, EachDepthLogsItsCrossEntropy) { expect_hand_losses("ce"); }
TEST(MtpLoss, DistillationIsTheSoftCrossEntropyAgainstThePolicysTopK) { expect_hand_losses("distill"); }

TEST(MtpLoss, TheMtpLayersLearn) {
  // Sequences that repeat a short pattern: the token two ahead is predictable.
  Transformer model(mtp_model(1), 8, at::kCPU);
  TrainerConfig cfg = sft(1.0);
  cfg.lr.lr = 3e-3;
  cfg.clip_grad = 1.0;
  Trainer trainer(cfg, model, nullptr);
  auto batch_of = [](int step) {
    std::vector<Sample> out;
    for (int i = 0; i < 6; ++i) {
      Sample s;
      for (int t = 0; t < 24; ++t) s.tokens.push_back(40 + ((step + i) % 5 + t) % 7);
      s.prompt_length = 3;
      out.push_back(s);
    }
    return out;
  };
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    auto b = batch_of(step);
    const double loss = trainer.train_step(b).at("train/mtp_loss");
    if (step == 0) first = loss;
    last = loss;
  }
  EXPECT_LT(last, 0.3 * first) << "first " << first << ", last " << last;
}

// A checkpoint written with a frozen draft holds no MTP moments; resumed with the draft
// trained, they start at zero, and the trunk's step is the frozen run's continuation bit
// for bit (the MTP loss never reaches the trunk).
TEST(MtpLoss, AFrozenDraftsCheckpointResumesWithTheDraftTrained) {
  // Its own name: the suite runs this program twice at once (tests/CMakeLists.txt: the AVX2 rerun).
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("mtp_frozen_resume_" + std::to_string(::getpid()) + ".h5")).string();
  Transformer frozen(mtp_model(1), 4, at::kCPU);
  Trainer a(sft(0.0), frozen, nullptr);
  for (int step = 0; step < 2; ++step) {
    auto b = samples(5, 30 + step);
    a.train_step(b);
  }
  a.save(path);
  Transformer resumed(mtp_model(1), 77, at::kCPU);
  Trainer c(sft(0.2), resumed, nullptr);
  c.load(path);
  std::remove(path.c_str());
  EXPECT_EQ(c.n_steps(), 2);
  std::map<std::string, at::Tensor> draft_before;
  for (const auto& p : resumed.parameters()) {
    EXPECT_TRUE(at::equal(p.tensor, frozen.parameter(p.name))) << p.name;
    if (is_mtp_parameter(p.name)) draft_before[p.name] = p.tensor.detach().clone();
  }
  auto ba = samples(5, 40), bc = samples(5, 40);
  const auto ma = a.train_step(ba), mc = c.train_step(bc);
  EXPECT_EQ(ma.at("train/loss"), mc.at("train/loss"));
  EXPECT_GT(mc.at("train/mtp_grad_norm"), 0.0);
  for (const auto& p : resumed.parameters()) {
    if (is_mtp_parameter(p.name)) EXPECT_FALSE(at::equal(p.tensor, draft_before[p.name])) << p.name << " did not move";
    else EXPECT_TRUE(at::equal(p.tensor, frozen.parameter(p.name))) << p.name;
  }
}

}  // namespace
}  // namespace slimpi
