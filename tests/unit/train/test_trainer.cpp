// Trainer pieces on one rank: AdamW against its formula, LR schedule, micro-batch
// plans, the gradient buffer, save -> load -> step bit-identical, SFT that learns.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <slimpi/error.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "data/jsonl_file.h"
#include "model/log_probs.h"
#include "tokenizer/byte_tokenizer.h"
#include "train/micro_batches.h"
#include "train/packed_batch.h"
#include "train/sft_data.h"
#include "train/trainer.h"
#include "../../support/tiny_model.h"

namespace slimpi {
namespace {

ModelConfig small_model() { return testing::tiny_model_config(32, 0.02); }

// Reproducible random SFT-like samples.
std::vector<Sample> random_samples(int n, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  std::vector<Sample> out;
  for (int i = 0; i < n; ++i) {
    Sample s;
    int64_t len = 4 + at::randint(12, {1}, g, at::kLong).item<int64_t>();
    at::Tensor t = at::randint(259, {len}, g, at::kLong);
    s.tokens.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + len);
    s.prompt_length = 1 + i % 3;
    out.push_back(s);
  }
  return out;
}

TEST(AdamW, MatchesTheFormulaOnOneTensor) {
  at::Tensor p = at::tensor(std::vector<float>{1.0f, -2.0f, 0.5f, 3.0f}).view({2, 2}).set_requires_grad(true);
  std::vector<NamedTensor> params{{"w", p}};
  AdamW::Options o{0.9, 0.99, 1e-8, 0.1};
  AdamW opt(params, o);
  std::vector<double> w{1, -2, 0.5, 3}, m(4, 0), v(4, 0);
  const double lr = 0.01;
  for (int t = 1; t <= 3; ++t) {
    std::vector<float> g{0.1f * t, -0.2f, 0.3f, 0.05f * t};
    p.mutable_grad() = at::tensor(g).view({2, 2});
    opt.step(lr);
    for (int i = 0; i < 4; ++i) {
      w[i] *= 1 - lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(o.beta2, t)) + o.eps;
      w[i] -= lr / (1 - std::pow(o.beta1, t)) * m[i] / denom;
    }
  }
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(p.view({4})[i].item<double>(), w[i], 1e-6);
  EXPECT_EQ(opt.n_steps(), 3);
}

TEST(LrSchedule, WarmupConstantCosine) {
  LrSchedule s{"cosine", 1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  EXPECT_NEAR(s.at(500), 0.1, 1e-12);
  LrSchedule c{"constant", 3e-4, 0, 0, 0};
  EXPECT_DOUBLE_EQ(c.at(0), 3e-4);
  EXPECT_DOUBLE_EQ(c.at(999), 3e-4);
}

TEST(MicroBatches, FixedAndFirstFit) {
  std::vector<int64_t> lens{5, 3, 8, 2, 7};
  auto fixed = plan_micro_batches(lens, 2, 0);
  EXPECT_EQ(fixed, (std::vector<std::vector<int64_t>>{{0, 1}, {2, 3, 4}}));
  EXPECT_EQ(plan_micro_batches(lens, 9, 0).size(), 5u);  // never an empty micro-batch
  auto dynamic = plan_micro_batches(lens, 1, 10);
  EXPECT_EQ(dynamic, (std::vector<std::vector<int64_t>>{{0, 1, 3}, {2}, {4}}));
  auto oversized = plan_micro_batches({12, 3}, 1, 10);  // a sample over the limit rides alone
  EXPECT_EQ(oversized, (std::vector<std::vector<int64_t>>{{0}, {1}}));
  EXPECT_TRUE(plan_micro_batches({}, 2, 0).empty());
}

TrainerConfig sft_config() {
  TrainerConfig c;
  c.mode = "sft";
  c.lr.lr = 1e-3;
  c.adam.beta2 = 0.99;
  c.grad_bucket_bytes = 4096;  // many buckets
  return c;
}

TEST(PackedBatch, ASplitTrajectoryPacksOneSequencePerContext) {
  // P = 3 prompt tokens, R = 12 response tokens, later contexts at 4 and 8: sequences
  // P + R[0..4], R[4..8], R[8..12) (the first two ending with the next context's first
  // token), scored as if each were a sample of its own, rows in the sample's order.
  Transformer m(testing::tiny_model_config(64, 0.2), 4, at::kCPU);
  Sample s;
  s.prompt_length = 3;
  for (int64_t t = 0; t < 15; ++t) s.tokens.push_back((t * 37 + 5) % 64);
  s.context_starts = {4, 8};
  const PackedBatch b = pack({s}, {0}, at::kCPU);
  EXPECT_EQ(b.seq_lens, (std::vector<int64_t>{8, 5, 4}));
  EXPECT_EQ(b.prompt_lens, (std::vector<int64_t>{3, 1, 1}));
  EXPECT_EQ(b.tokens.size(0), s.packed_length());
  auto part = [&](int64_t from, int64_t to, int64_t prompt) {  // tokens [from, to) as a sample
    Sample p;
    p.tokens.assign(s.tokens.begin() + from, s.tokens.begin() + to);
    p.prompt_length = prompt;
    return p;
  };
  const std::vector<Sample> apart = {part(0, 8, 3), part(7, 12, 1), part(11, 15, 1)};
  const at::Tensor split = packed_log_probs(m, b, Precision::FP32, 1.0, false).logp;                       // [12]
  const at::Tensor each = packed_log_probs(m, pack(apart, {0, 1, 2}, at::kCPU), Precision::FP32, 1.0, false).logp;
  ASSERT_EQ(split.numel(), 12);
  EXPECT_TRUE(at::allclose(split, each, 0, 1e-6)) << split << each;
  Sample joined = s;
  joined.context_starts.clear();
  EXPECT_FALSE(at::allclose(split, packed_log_probs(m, pack({joined}, {0}, at::kCPU), Precision::FP32, 1.0, false).logp,
                            0, 1e-4));
  s.context_starts = {8, 4};
  EXPECT_THROW(pack({s}, {0}, at::kCPU), Error);
}

TEST(Trainer, GradientsLiveInTheFlatBufferAndItsNormIsTheGlobalNorm) {
  Transformer model(small_model(), 3, at::kCPU);
  Trainer trainer(sft_config(), model, nullptr);
  auto samples = random_samples(6, 1);
  auto metrics = trainer.train_step(samples);
  EXPECT_TRUE(trainer.grads().grads_alias_buffer());
  EXPECT_GT(trainer.grads().n_buckets(), 10);
  double sq = 0;
  for (const auto& p : model.parameters()) sq += p.tensor.grad().to(at::kDouble).pow(2).sum().item<double>();
  EXPECT_NEAR(std::sqrt(sq), std::min(metrics["train/grad_norm"], 1.0), 1e-4);  // clipped to 1
  EXPECT_GT(metrics["train/loss"], 4.0);  // ~log(260) at init
}

TEST(Trainer, SaveLoadThenStepIsBitIdenticalToStraightSteps) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("slimpi_trainer_" + std::to_string(::getpid()) + ".h5")).string();
  auto batch1 = random_samples(8, 10), batch2 = random_samples(8, 11), batch3 = random_samples(8, 12);
  TrainerConfig cfg = sft_config();
  cfg.adam.weight_decay = 0.01;
  cfg.n_micro_batches = 2;

  Transformer straight(small_model(), 4, at::kCPU);
  Trainer a(cfg, straight, nullptr);
  a.train_step(batch1);
  a.train_step(batch2);
  auto last_a = a.train_step(batch3);

  Transformer first(small_model(), 4, at::kCPU);
  Trainer b(cfg, first, nullptr);
  b.train_step(batch1);
  b.train_step(batch2);
  b.save(path);

  Transformer resumed(small_model(), 99, at::kCPU);  // different init: everything must come from the file
  Trainer c(cfg, resumed, nullptr);
  c.load(path);
  EXPECT_EQ(c.n_steps(), 2);
  auto last_c = c.train_step(batch3);
  EXPECT_EQ(last_a["train/loss"], last_c["train/loss"]);
  EXPECT_EQ(last_a["train/grad_norm"], last_c["train/grad_norm"]);
  for (size_t i = 0; i < straight.parameters().size(); ++i)
    EXPECT_TRUE(at::equal(straight.parameters()[i].tensor, resumed.parameters()[i].tensor))
        << straight.parameters()[i].name;
  std::filesystem::remove(path);
}

// Log-probs [R] of a sample's response tokens under `model`, one sequence alone (autograd on).
at::Tensor response_logp(const Transformer& model, const Sample& s) {
  at::Tensor tokens = at::tensor(s.tokens, at::kLong);
  at::Tensor logits = model.forward_packed(tokens, {int64_t(s.tokens.size())});
  return score_tokens(logits, response_positions(tokens, {int64_t(s.tokens.size())}, {s.prompt_length}), 1.0, false)
      .logp;
}

// The trainer's gradients equal the ones computed by hand on an identical model.
void expect_same_gradients(const Transformer& model, const Transformer& reference) {
  for (size_t i = 0; i < model.parameters().size(); ++i) {
    const at::Tensor& got = model.parameters()[i].tensor.grad();
    const at::Tensor& want = reference.parameters()[i].tensor.grad();
    EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-6)) << model.parameters()[i].name << " max |diff| "
                                                    << (got - want).abs().max().item<double>();
  }
}

TEST(Trainer, RlStepWithRatioOneHasTheReinforceGradientAndLogsSlimeMetrics) {
  TrainerConfig cfg;
  cfg.mode = "rl";
  cfg.lr.lr = 1e-3;
  cfg.clip_grad = 0.0;  // compare raw gradients
  auto samples = random_samples(4, 7);
  for (size_t i = 0; i < samples.size(); ++i) {
    samples[i].advantages.resize(samples[i].response_length());
    for (int64_t t = 0; t < samples[i].response_length(); ++t)
      samples[i].advantages[t] = (i % 2 ? 1.0f : -0.5f) + 0.25f * float(t);
  }

  // The REINFORCE gradient by hand on an identical model: the reducer's objective is
  // the mean over samples of each sample's token mean of −A_t·logp_t.
  Transformer reference(small_model(), 5, at::kCPU);
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    const at::Tensor logp = response_logp(reference, s);
    at::Tensor adv = at::tensor(s.advantages);
    ((-adv * logp).mean() / double(samples.size())).backward();
  }

  Transformer model(small_model(), 5, at::kCPU);
  Trainer trainer(cfg, model, nullptr);
  trainer.compute_log_probs(samples, /*reference=*/false);
  for (auto& s : samples) {  // the engine's log-probs, here off by exactly 0.01
    s.rollout_log_probs = s.old_log_probs;
    for (float& x : s.rollout_log_probs) x += 0.01f;
    s.old_log_probs.clear();  // one step per rollout: the step's forward supplies them (ρ = 1)
  }
  auto m = trainer.train_step(samples);
  expect_same_gradients(model, reference);
  EXPECT_GT(m["train/grad_norm"], 1e-3);
  EXPECT_LT(std::abs(m["train/ppo_kl"]), 1e-8);
  EXPECT_EQ(m["train/pg_clipfrac"], 0.0);
  EXPECT_NEAR(m["train/train_rollout_logprob_abs_diff"], 0.01, 1e-5);
  for (const auto& s : samples) EXPECT_EQ(int64_t(s.old_log_probs.size()), s.response_length());  // captured
  for (const char* k : {"train/loss", "train/pg_loss", "train/entropy_loss", "train/grad_norm", "train/lr"})
    EXPECT_TRUE(m.count(k)) << k;
}

// MIS (train.tis_function = "mis", mode mask): samples whose ratio leaves the bounds
// leave the numerators; the kept ones carry their weight; every sample still counts in
// the denominator (slime's rebuilt reducer keeps the per-rollout totals).
TEST(Trainer, MisRejectedTokensLeaveTheLossNumeratorsNotTheDenominators) {
  TrainerConfig cfg;
  cfg.mode = "rl";
  cfg.lr.lr = 1e-3;
  cfg.clip_grad = 0.0;
  cfg.use_tis = true;
  cfg.mismatch.function = TisFunction::Mis;
  cfg.mismatch.mode = MisMode::Mask;
  cfg.mismatch.lower = 0.9;
  cfg.mismatch.upper = 1.1;
  auto samples = random_samples(4, 7);
  for (auto& s : samples) s.advantages.assign(s.response_length(), 1.0f);
  Transformer model(small_model(), 5, at::kCPU);
  Trainer trainer(cfg, model, nullptr);
  trainer.compute_log_probs(samples, /*reference=*/false);
  const float gap[] = {0.01f, 1.0f, 0.01f, 1.0f};  // rollout − trainer: ratios e^-0.01 (kept), e^-1 (rejected)
  for (size_t i = 0; i < samples.size(); ++i) {
    samples[i].rollout_log_probs = samples[i].old_log_probs;
    for (float& x : samples[i].rollout_log_probs) x += gap[i];
    samples[i].old_log_probs.clear();
  }
  Transformer reference(small_model(), 5, at::kCPU);
  for (size_t i : {0, 2}) {
    const Sample& s = samples[i];
    const at::Tensor logp = response_logp(reference, s);
    ((-std::exp(-0.01) * logp).mean() / 4.0).backward();
  }
  auto m = trainer.train_step(samples);
  expect_same_gradients(model, reference);
  EXPECT_NEAR(m["train/mis_tis_mask_fraction_low"], 0.5, 1e-6);  // over all tokens, before rejection
  EXPECT_NEAR(m["train/ois"], 1.0, 1e-6);
  EXPECT_NEAR(m["train/mis_kl"], (0.01 + 1.0) / 2, 1e-5);
}

// A mixture-of-experts policy: the step reports the routers' load-balancing and z-losses
// of its forward, and their coefficients add exactly their gradients (through the
// routers, and through everything before them).
TEST(Trainer, MoeStepAddsTheRouterLossesWithTheirCoefficients) {
  ModelConfig mc = small_model();
  mc.n_experts = 4;
  mc.n_experts_per_tok = 2;
  mc.moe_intermediate_size = 16;
  auto samples = random_samples(3, 11);
  auto grads_with = [&](double aux_coef, double z_coef, std::map<std::string, double>* metrics) {
    TrainerConfig cfg = sft_config();
    cfg.clip_grad = 0.0;
    cfg.moe_aux_loss_coef = aux_coef;
    cfg.moe_z_loss_coef = z_coef;
    Transformer model(mc, 5, at::kCPU);
    Trainer trainer(cfg, model, nullptr);
    auto m = trainer.train_step(samples);
    if (metrics) *metrics = m;
    std::map<std::string, at::Tensor> g;
    for (const auto& p : model.parameters()) g[p.name] = p.tensor.grad().clone();
    return g;
  };
  std::map<std::string, double> m;
  const auto plain = grads_with(0.0, 0.0, &m);
  const auto with = grads_with(0.1, 0.01, nullptr);
  // The losses by hand on the same model and tokens (one micro-batch: all tokens).
  Transformer model(mc, 5, at::kCPU);
  std::vector<int64_t> tokens, lens;
  for (const auto& smp : samples) {
    tokens.insert(tokens.end(), smp.tokens.begin(), smp.tokens.end());
    lens.push_back(int64_t(smp.tokens.size()));
  }
  MoeTrace trace;
  model.forward_packed(at::tensor(tokens, at::kLong), lens, &trace);
  ASSERT_EQ(trace.router_logits.size(), size_t(mc.n_layers));
  const at::Tensor aux = moe_load_balancing_loss(trace.router_logits, 2), z = moe_router_z_loss(trace.router_logits);
  EXPECT_NEAR(m.at("train/moe_aux_loss"), aux.item<double>(), 1e-6);
  EXPECT_NEAR(m.at("train/moe_z_loss"), z.item<double>(), 1e-6);
  (0.1 * aux + 0.01 * z).backward();
  for (const auto& p : model.parameters()) {
    const at::Tensor extra = p.tensor.grad().defined() ? p.tensor.grad() : at::zeros_like(p.tensor);
    EXPECT_TRUE(at::allclose(with.at(p.name) - plain.at(p.name), extra, 1e-4, 1e-7)) << p.name;
  }
  EXPECT_GT(with.at("model.layers.0.mlp.gate.weight").sub(plain.at("model.layers.0.mlp.gate.weight")).abs().max().item<double>(), 1e-6);
}

// Routing replay refuses traces that cannot be the engine's: missing, mis-sized, an
// expert out of range, an expert twice for one token.
TEST(Trainer, RoutingReplayRefusesBadTraces) {
  ModelConfig mc = small_model();
  mc.n_experts = 4;
  mc.n_experts_per_tok = 2;
  mc.moe_intermediate_size = 16;
  TrainerConfig cfg;
  cfg.mode = "rl";
  cfg.routing_replay = true;
  Transformer model(mc, 5, at::kCPU);
  Trainer trainer(cfg, model, nullptr);
  auto with_trace = [&](std::function<void(std::vector<int16_t>&)> edit) {
    auto samples = random_samples(2, 3);
    for (auto& s : samples) {
      s.advantages.assign(s.response_length(), 1.0f);
      for (size_t t = 0; t + 1 < s.tokens.size(); ++t)
        for (int64_t l = 0; l < mc.n_layers; ++l) s.routing.insert(s.routing.end(), {int16_t(t % 4), int16_t((t + 1) % 4)});
    }
    edit(samples[1].routing);
    return samples;
  };
  auto error_of = [&](std::vector<Sample> samples) -> std::string {
    try {
      trainer.train_step(samples);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error_of(with_trace([](auto&) {})), "");
  EXPECT_NE(error_of(with_trace([](auto& r) { r.clear(); })).find("a routing trace of 0 expert ids"), std::string::npos);
  EXPECT_NE(error_of(with_trace([](auto& r) { r.resize(r.size() - 4); })).find("needs (tokens - 1)"), std::string::npos);
  EXPECT_NE(error_of(with_trace([](auto& r) { r[2] = 4; })).find("names expert 4; the model has 4"), std::string::npos);
  EXPECT_NE(error_of(with_trace([](auto& r) { r[1] = r[0]; })).find("twice for one token"), std::string::npos);
}

TEST(Trainer, NonFiniteStepsNeverReachTheWeightsOrACheckpoint) {
  TrainerConfig cfg;
  cfg.mode = "rl";
  cfg.lr.lr = 1e-3;
  auto samples = random_samples(3, 8);
  for (auto& s : samples) s.advantages.assign(s.response_length(), 1.0f);
  samples[1].advantages[0] = std::numeric_limits<float>::quiet_NaN();

  Transformer model(small_model(), 6, at::kCPU);
  Trainer trainer(cfg, model, nullptr);
  std::vector<at::Tensor> before;
  for (const auto& p : model.parameters()) before.push_back(p.tensor.detach().clone());
  auto unchanged = [&] {
    for (size_t i = 0; i < before.size(); ++i)
      if (!at::equal(before[i], model.parameters()[i].tensor)) return false;
    return true;
  };
  try {
    trainer.train_step(samples);
    ADD_FAILURE() << "a NaN loss was trained";
  } catch (const Error& e) {
    EXPECT_TRUE(std::string(e.what()).find("nan and the gradient norm") != std::string::npos) << e.what();
  }
  EXPECT_TRUE(unchanged());
  EXPECT_EQ(trainer.n_steps(), 0);

  cfg.skip_nonfinite_steps = true;
  Trainer skipping(cfg, model, nullptr);
  auto m = skipping.train_step(samples);
  EXPECT_EQ(m["train/skipped_nonfinite_step"], 1.0);
  EXPECT_TRUE(unchanged());
  EXPECT_EQ(skipping.n_steps(), 0);
  samples[1].advantages[0] = 1.0f;
  m = skipping.train_step(samples);
  EXPECT_EQ(m["train/skipped_nonfinite_step"], 0.0);
  EXPECT_FALSE(unchanged());

  const std::string path =
      (std::filesystem::temp_directory_path() / ("slimpi_nan_" + std::to_string(::getpid()) + ".h5")).string();
  {
    at::NoGradGuard no_grad;
    model.parameters()[3].tensor.view(-1)[0] = std::numeric_limits<float>::infinity();
  }
  EXPECT_THROW(skipping.save(path), Error);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Sft, LearnsAdditionClearlyInAFewHundredSteps) {
  at::set_num_threads(1);
  ModelConfig mc = small_model();
  mc.hidden_size = 64;
  mc.n_heads = 4;
  mc.n_kv_heads = 4;
  mc.intermediate_size = 128;
  Transformer model(mc, 1, at::kCPU);
  TrainerConfig cfg = sft_config();
  cfg.lr.lr = 3e-3;
  cfg.lr.warmup_steps = 10;
  cfg.calculate_per_token_loss = true;
  Trainer trainer(cfg, model, nullptr);
  SftData data(SLIMPI_SOURCE_DIR "/inputs/data/addition_sft.jsonl", "prompt", "response", mc.max_seq_len, 1, ByteTokenizer());
  EXPECT_EQ(data.size(), 4000u);
  double first = 0, last = 0;
  const int steps = 200;
  for (int s = 0; s < steps; ++s) {
    auto batch = data.batch(s, 32, 0, 1);
    double loss = trainer.train_step(batch)["train/loss"];
    if (s < 5) first += loss / 5;
    if (s >= steps - 5) last += loss / 5;
  }
  // From ~log(260) = 5.6 nats per response token to under a third of it: the model
  // has learned the answer format (digits, then EOS) and started on the sums. (A
  // model that knew only the format would sit near ln(10) = 2.3 nats per digit.)
  EXPECT_GT(first, 4.5);
  EXPECT_LT(last, first / 3) << "first " << first;
  EXPECT_LT(last, 1.7) << "first " << first;
}

TEST(SftData, OrderIsAPermutationPerEpochAndSplitsOverRanks) {
  SftData data(SLIMPI_SOURCE_DIR "/inputs/data/addition_sft.jsonl", "prompt", "response", 32, 7, ByteTokenizer());
  std::vector<bool> seen(data.size(), false);
  for (size_t k = 0; k < data.size(); ++k) seen[data.order(int64_t(k))] = true;
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](bool b) { return b; }));
  auto whole = data.batch(3, 10, 0, 1);
  auto r0 = data.batch(3, 10, 0, 4), r3 = data.batch(3, 10, 3, 4);
  EXPECT_EQ(r0.size() + data.batch(3, 10, 1, 4).size() + data.batch(3, 10, 2, 4).size() + r3.size(), 10u);
  EXPECT_EQ(r0[0].tokens, whole[0].tokens);
  EXPECT_EQ(r3.back().tokens, whole.back().tokens);
  ByteTokenizer tok;
  EXPECT_EQ(whole[0].tokens[0], ByteTokenizer::kBos);
  EXPECT_EQ(whole[0].tokens.back(), ByteTokenizer::kEos);
  EXPECT_EQ(tok.decode(whole[0].tokens).find('='), size_t(whole[0].prompt_length - 2));
}

TEST(Jsonl, BadLinesNameFileLineAndKey) {
  const std::string path = (std::filesystem::temp_directory_path() / ("slimpi_bad_" + std::to_string(::getpid()) + ".jsonl")).string();
  auto error_of = [&](const std::string& text) {
    std::ofstream(path) << text;
    try {
      read_jsonl(path, {"prompt", "response"});
    } catch (const Error& e) {
      EXPECT_TRUE(e.collective());
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of("{\"prompt\": \"a\", \"response\": \"b\"}\n\n{\"prompt\": \"a\"}\n"),
            path + ":3: missing key 'response'");
  EXPECT_EQ(error_of("{\"prompt\": 3, \"response\": \"b\"}\n"), path + ":1: key 'prompt' must be a string, got number");
  EXPECT_EQ(error_of("[1, 2]\n"), path + ":1: expected a JSON object per line, got array");
  EXPECT_EQ(error_of("{\"prompt\": \"a\", \"respo").substr(0, path.size() + 18), path + ":1: not valid JSON");
  std::filesystem::remove(path);
  EXPECT_EQ(error_of("").substr(0, 20), "data file '" + path.substr(0, 9));
}

}  // namespace
}  // namespace slimpi
