// Pipeline parallelism at np 1, 2 and 4 (model/pipeline_shard.h, train/trainer_pipeline.cpp),
// against one rank:
// - the stages' layer counts (even and explicit splits) and what each stage holds;
// - a whole trainer step of a model split into stages (PP = np; PP 2 x DP 2, TP 2 x PP 2
//   and CP 2 x PP 2 at np 4) against the same step of the whole model, data-parallel over
//   the same data-parallel group: old and reference log-probs, rollout and step metrics,
//   every gradient and updated weight, to fp32 round-off, with one micro-batch and with
//   more micro-batches than stages (the 1F1B schedule's warm-up, steady state and
//   cool-down), uneven layer splits, tied embeddings (the last stage's copy of the
//   embedding: its gradient summed with the first stage's, the two stay equal), the
//   distributed optimizer, activation recomputation, bf16 forwards, SFT;
// - DeepSeekMoE models (a first dense layer, so that PP 4's first stage has no MoE layer)
//   with and without routing replay, their load-balancing and z-losses added up over the
//   stages; expert parallelism over the pipelines (PP 2 x EP 2, one pipeline with fewer
//   micro-batches: idle ones through its stages; also in bf16); CP 2 x PP 2; exact
//   numerics (log-probs bit for bit, dense and MoE);
// - MTP layers on the last stage (untied: its copy of the embedding their token input;
//   tied; MoE depths with expert parallelism);
// - PPO's critic in stages (its values, its step's metrics and parameters; with TP 2 and
//   a tied embedding, whose copy the critic leaves alone); a trainer-side teacher of
//   another depth in the same stages (its log-probs and top-k on every stage);
// - the split trainer's checkpoint loads into the whole model, and the stages gathered
//   are the whole model.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <string>

#include "split_step_checks.h"
#include "kernels/batch_invariant.h"
#include "model/pipeline_shard.h"
#include "parallel/device.h"
#include "parallel/mpi_comm.h"
#include "sync/whole_model.h"
#include "train/model_parallel.h"
#include "train/trainer.h"
#include "../support/tensor_checks.h"
#include "../support/tiny_model.h"

namespace slimpi {
namespace {

using testing::by_name;
using testing::expect_close;

TEST(PipelineStages, SplitLayersAndHoldTheirParameters) {
  EXPECT_EQ(stage_layer_counts(7, 3, {}), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(stage_layer_counts(4, 4, {}), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(stage_layer_counts(4, 2, {3, 1}), (std::vector<int64_t>{3, 1}));
  EXPECT_THROW(stage_layer_counts(3, 4, {}), Error);        // a stage without a layer
  EXPECT_THROW(stage_layer_counts(4, 2, {2, 1}), Error);    // 3 of 4 layers
  EXPECT_THROW(stage_layer_counts(4, 2, {4, 0}), Error);    // an empty stage
  EXPECT_THROW(stage_layer_counts(4, 2, {1, 1, 2}), Error); // 3 counts for 2 stages
  PipelineShard last{1, 2, nullptr, nullptr, 3, 4};
  EXPECT_TRUE(last.holds("model.layers.3.mlp.up_proj.weight", 4, true));
  EXPECT_FALSE(last.holds("model.layers.2.mlp.up_proj.weight", 4, true));
  EXPECT_TRUE(last.holds("lm_head.weight", 4, false));
  EXPECT_TRUE(last.holds("model.embed_tokens.weight", 4, true));  // the tied head's (or the MTP layers') copy
  EXPECT_FALSE(last.holds("model.embed_tokens.weight", 4, false));
  EXPECT_TRUE(last.is_embedding_copy("model.embed_tokens.weight", true));
  EXPECT_TRUE(last.holds("model.mtp_layers.0.input_proj.weight", 4, true));
  PipelineShard first{0, 2, nullptr, nullptr, 0, 3};
  EXPECT_FALSE(first.holds("model.norm.weight", 4, true));
  EXPECT_FALSE(first.holds("model.mtp_layers.0.input_proj.weight", 4, true));
  EXPECT_FALSE(first.is_embedding_copy("model.embed_tokens.weight", true));
  ModelConfig mtp = testing::tiny_model_config(/*max_seq_len=*/8, /*init_std=*/0.1);
  EXPECT_FALSE(last_stage_copies_embedding(mtp));
  mtp.mtp_num_layers = 1;
  EXPECT_TRUE(last_stage_copies_embedding(mtp));
}

struct Case {
  int tensor_parallel = 1, context_parallel = 1, pipeline_parallel = 0;  // 0: every rank
  int expert_parallel = 1;
  bool moe = false, replay = true;
  bool exact = false;  // exact numerics (train.on_policy = "exact"): log-probs bit for bit
  int mtp = 0;         // MTP depths (on the last stage, with its copy of the embedding)
  bool ppo = false;    // PPO: the critic in stages too (its values, its step)
  bool teacher = false;  // on-policy distillation, a trainer-side teacher of 5 layers in the same stages
  bool fewer_samples_on_d1 = false;  // data-parallel index 1 gets 2 samples (fewer micro-batches)
  std::vector<int64_t> layers;  // per stage (empty: even)
  bool tied = false;
  int64_t micro_batches = 2;
  bool distributed_optimizer = false, bf16 = false, sft = false;
  bool old_from_step = false;  // the old log-probs from the step's own forward (one step a rollout)
  Transformer::Recompute recompute = Transformer::Recompute::None;
  std::string name;
};

ModelConfig config_of(const Case& c) {
  ModelConfig m = testing::tiny_model_config(/*max_seq_len=*/48, /*init_std=*/0.1);
  m.n_layers = 4;
  m.n_heads = 8;
  m.n_kv_heads = 2;
  m.explicit_head_dim = 8;
  m.qk_norm = true;
  m.qkv_bias = true;
  m.tie_word_embeddings = c.tied;
  m.mtp_num_layers = c.mtp;
  if (c.moe) testing::use_split_test_moe(m);
  return m;
}

TrainerConfig trainer_config(const Case& c) {
  TrainerConfig t;
  t.mode = c.sft ? "sft" : "rl";
  t.use_kl_loss = !c.sft && !c.ppo;
  t.kl_loss_coef = 0.1;
  t.kl_loss_type = "low_var_kl";
  t.entropy_coef = c.sft ? 0.0 : 0.01;
  t.normalize_advantages = !c.sft && !c.ppo;
  t.n_micro_batches = c.micro_batches;
  t.clip_grad = 0.5;  // acts: the norm must count every parameter once
  t.lr.lr = 1e-2;
  t.adam.eps = 1e-3;
  t.grad_bucket_bytes = 1 << 12;
  t.distributed_optimizer = c.distributed_optimizer;
  t.recompute = c.recompute;
  t.precision = c.bf16 ? Precision::BF16 : Precision::FP32;
  t.moe_aux_loss_coef = 0.01;
  t.moe_z_loss_coef = 0.001;
  t.routing_replay = c.moe && c.replay;
  t.mtp_loss_coef = c.mtp > 0 ? 0.3 : 0.0;
  if (c.teacher) {
    t.opd_kl_coef = 0.5;
    t.opd_topk_loss_coef = 0.5;
    t.opd_top_k = 3;
  }
  if (c.ppo) {
    t.estimator = &advantage_estimators().get("ppo");
    t.gamma = 0.9;
    t.lambd = 0.8;
    t.critic.lr.lr = 1e-2;
    t.critic.seed = 5;
  }
  return t;
}

std::vector<Sample> samples_of(int d, const ModelConfig& cfg, int n = 5) {
  at::Generator g = at::detail::createCPUGenerator(500 + d);
  std::vector<Sample> out;
  const int64_t lengths[] = {2, 30, 9, 3, 17};
  for (int i = 0; i < n; ++i) {
    Sample s;
    at::Tensor tok = at::randint(259, {lengths[i]}, g, at::kLong);
    s.tokens.assign(tok.data_ptr<int64_t>(), tok.data_ptr<int64_t>() + lengths[i]);
    s.prompt_length = std::min<int64_t>(1 + i, lengths[i] - 1);
    s.reward = at::randn({1}, g).item<float>();
    s.group_index = i;
    if (cfg.n_experts > 0) testing::add_routing_trace(s, cfg, i);
    out.push_back(s);
  }
  return out;
}

class PipelineParallelStep : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineParallelStep, EqualsTheWholeModel) {
  MpiComm world(MPI_COMM_WORLD, "trainer");
  const int n = world.size();
  const Case c = GetParam();
  const int tp = c.tensor_parallel, cp = c.context_parallel;
  const int pp = c.pipeline_parallel == 0 ? n / (tp * cp) : c.pipeline_parallel;
  if (pp < 2 || n % (tp * cp * pp) != 0 || (!c.layers.empty() && int(c.layers.size()) != pp) ||
      (n / (tp * pp)) % c.expert_parallel != 0 || (c.fewer_samples_on_d1 && n / (tp * cp * pp) < 2))
    GTEST_SKIP() << c.name << " at np " << n;
  const ModelConfig cfg = config_of(c);
  struct ExactNumerics {  // the process-wide switch, for this case alone
    explicit ExactNumerics(bool on) { set_exact_numerics(on); }
    ~ExactNumerics() { set_exact_numerics(false); }
  } exact_numerics_scope(c.exact);
  ModelParallel mp(MPI_COMM_WORLD, tp, c.expert_parallel, DeviceChoice{}, false, kv_head_replicas(cfg, tp), cp, pp);
  const PipelineShard stage = mp.pipeline_shard(stage_layer_counts(cfg.n_layers, pp, c.layers));
  ASSERT_EQ(stage.size, pp);
  const int d = mp.data_index();
  const int n_samples = c.fewer_samples_on_d1 && d == 1 ? 2 : 5;
  const TrainerConfig tc = trainer_config(c);
  // bf16 forwards: a stage's products over its batch round where one rank's might not
  // (another kernel): log-probs within a few bf16 ulps of their magnitude, gradients and
  // weights within a tenth of their largest entry.
  const double logp_tol = c.bf16 ? 0.1 : 2e-5, metric_tol = c.bf16 ? 2e-2 : 2e-5;

  Transformer whole(cfg, 1, at::kCPU), whole_ref(cfg, 2, at::kCPU);
  TrainerConfig whole_tc = tc;
  whole_tc.distributed_optimizer = false;
  whole_tc.recompute = Transformer::Recompute::None;
  const bool reference = !c.sft && !c.ppo;
  // A teacher of its own depth (5 layers: 3 + 2 at PP 2), whole and in the stages.
  ModelConfig teacher_cfg = cfg;
  teacher_cfg.n_layers = 5;
  teacher_cfg.mtp_num_layers = 0;
  Transformer teacher_whole(teacher_cfg, 7, at::kCPU);
  Transformer teacher_staged(teacher_cfg, 7, at::kCPU, at::kFloat, {}, {}, {},
                             stage.for_layers(stage_layer_counts(teacher_cfg.n_layers, pp, {})));
  Trainer base(whole_tc, whole, &mp.data(), reference ? &whole_ref : nullptr);
  if (c.teacher) base.set_teacher(&teacher_whole);
  std::vector<Sample> want = samples_of(d, cfg, n_samples);
  std::map<std::string, double> want_rollout;
  if (!c.sft) want_rollout = base.prepare_rollout(want, /*recompute_old=*/!c.old_from_step);
  const auto want_step = base.train_step(want);
  const auto want_grads = by_name(whole.parameters(), true);
  const auto want_weights = by_name(whole.parameters(), false);

  const ExpertShard experts = mp.expert_shard();
  Transformer shard(cfg, 1, at::kCPU, at::kFloat, experts, mp.tensor_shard(), mp.context_shard(), stage);
  Transformer shard_ref(cfg, 2, at::kCPU, at::kFloat, experts, mp.tensor_shard(), mp.context_shard(), stage);
  ASSERT_LT(shard.n_params(), whole.n_params());
  Trainer split(tc, shard, &mp.data(), reference ? &shard_ref : nullptr, mp.expert_replicas(), &mp.replicas());
  if (c.teacher) split.set_teacher(&teacher_staged);
  std::vector<Sample> got = samples_of(d, cfg, n_samples);
  if (!c.sft) {
    const auto got_rollout = split.prepare_rollout(got, /*recompute_old=*/!c.old_from_step);
    for (size_t j = 0; j < got.size(); ++j)
      for (size_t i = 0; i < got[j].old_log_probs.size(); ++i) {  // every stage holds the last stage's
        EXPECT_NEAR(got[j].old_log_probs[i], want[j].old_log_probs[i], logp_tol) << c.name << " sample " << j;
        if (reference)
          EXPECT_NEAR(got[j].ref_log_probs[i], want[j].ref_log_probs[i], logp_tol) << c.name << " sample " << j;
        if (c.ppo) EXPECT_NEAR(got[j].values[i], want[j].values[i], 2e-5) << c.name << " value, sample " << j;
        if (c.teacher) {  // the teacher's stages give every stage its log-probs and top-k
          EXPECT_NEAR(got[j].teacher_log_probs[i], want[j].teacher_log_probs[i], logp_tol) << c.name << " sample " << j;
          for (int64_t r = 0; r < tc.opd_top_k; ++r) {
            const size_t at = i * size_t(tc.opd_top_k) + size_t(r);
            EXPECT_EQ(got[j].teacher_topk_ids[at], want[j].teacher_topk_ids[at]) << c.name << " sample " << j;
            EXPECT_NEAR(got[j].teacher_topk_probs[at], want[j].teacher_topk_probs[at], 1e-6) << c.name;
          }
        }
        if (c.exact) {  // batch-invariant rows: the stages give the whole model's bits
          EXPECT_EQ(got[j].old_log_probs[i], want[j].old_log_probs[i]) << c.name << " sample " << j << " token " << i;
          EXPECT_EQ(got[j].ref_log_probs[i], want[j].ref_log_probs[i]) << c.name << " sample " << j << " token " << i;
        }
      }
    for (const auto& [k, x] : want_rollout)
      EXPECT_NEAR(got_rollout.at(k), x, metric_tol * std::max(1.0, std::abs(x))) << c.name << ": " << k;
  }
  const auto got_step = split.train_step(got);
  testing::expect_metrics_near(got_step, want_step, metric_tol, c.name);  // every stage: the last stage's
  EXPECT_GT(want_step.at("train/grad_norm"), 0.5);  // the clip acted
  if (c.moe) {  // the router losses and the routing metrics of every stage's layers, added up
    EXPECT_GT(want_step.at("train/moe_aux_loss"), 0.1) << c.name;
    EXPECT_GT(want_step.at("train/moe_z_loss"), 0.01) << c.name;
    EXPECT_TRUE(want_step.count("train/routing_agreement_by_layer/3")) << c.name;
  }
  if (c.old_from_step)  // taken by the last stage's forward, kept by every stage
    for (size_t j = 0; j < got.size(); ++j) {
      ASSERT_EQ(got[j].old_log_probs.size(), want[j].old_log_probs.size()) << c.name << " sample " << j;
      for (size_t i = 0; i < got[j].old_log_probs.size(); ++i)
        EXPECT_NEAR(got[j].old_log_probs[i], want[j].old_log_probs[i], logp_tol) << c.name << " sample " << j;
    }
  const StoredWhole stored{&cfg, mp.tensor_shard()};
  if (c.ppo) {  // the critic's step: its metrics, and each stage's parameters (the value head on the last)
    const auto want_critic = base.critic()->train_step(want), got_critic = split.critic()->train_step(got);
    for (const auto& [k, x] : want_critic)
      EXPECT_NEAR(got_critic.at(k), x, 1e-4 * std::max(1.0, std::abs(x))) << c.name << ": " << k;
    const auto whole_critic = by_name(base.critic()->parameters(), false);
    for (const auto& p : split.critic()->parameters())
      expect_close(p.tensor.detach(), stored.part_of(p.name, whole_critic.at(p.name)),
                   c.name + ": updated critic " + p.name, 1e-4, 1e-6);
    bool head = false;
    for (const auto& p : split.critic()->parameters()) head = head || p.name == "value_head.weight";
    EXPECT_EQ(head, stage.last()) << c.name;
  }
  testing::expect_shard_matches_whole(shard, stored, want_grads, want_weights, c.bf16, !c.distributed_optimizer,
                                      c.name);

  // The stages gathered are the whole model; the checkpoint loads into one rank.
  Transformer gathered(cfg, 9, at::kCPU);
  gather_whole_model(shard, &gathered, /*to_all=*/true);
  for (const auto& p : shard.parameters())
    EXPECT_TRUE(at::equal(p.tensor.detach(), stored.part_of(p.name, gathered.parameter(p.name).detach())))
        << c.name << ": gathered " << p.name;
  testing::expect_checkpoint_loads_whole(split, shard, cfg, stored, whole_tc, c.name);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PipelineParallelStep,
    ::testing::Values(Case{.name = "even"}, Case{.micro_batches = 1, .name = "one_micro_batch"},
                      Case{.micro_batches = 5, .name = "more_micro_batches_than_stages"},
                      Case{.tied = true, .micro_batches = 5, .name = "tied_embeddings"},
                      Case{.pipeline_parallel = 2, .layers = {3, 1}, .tied = true, .name = "uneven_pp2_dp2"},
                      Case{.pipeline_parallel = 2, .tied = true, .distributed_optimizer = true, .name = "tied_pp2_dp2_zero1"},
                      Case{.recompute = Transformer::Recompute::Full, .name = "full_recompute"},
                      Case{.bf16 = true, .name = "bf16"}, Case{.sft = true, .name = "sft"},
                      Case{.micro_batches = 3, .old_from_step = true, .name = "old_log_probs_from_the_step"},
                      Case{.tensor_parallel = 2, .pipeline_parallel = 2, .name = "tp2_pp2"},
                      Case{.tensor_parallel = 2, .pipeline_parallel = 2, .tied = true, .micro_batches = 3,
                           .name = "tied_tp2_pp2"},
                      Case{.context_parallel = 2, .pipeline_parallel = 2, .tied = true, .name = "cp2_pp2"},
                      Case{.moe = true, .micro_batches = 3, .name = "moe_replay"},
                      Case{.exact = true, .name = "exact"}, Case{.moe = true, .exact = true, .name = "moe_exact"},
                      Case{.moe = true, .replay = false, .name = "moe_routed"},
                      Case{.pipeline_parallel = 2, .expert_parallel = 2, .moe = true, .fewer_samples_on_d1 = true,
                           .micro_batches = 3, .name = "moe_pp2_ep2"},
                      Case{.mtp = 2, .name = "mtp"}, Case{.teacher = true, .name = "teacher"}, Case{.ppo = true, .micro_batches = 3, .name = "ppo_critic"},
                      Case{.tensor_parallel = 2, .pipeline_parallel = 2, .ppo = true, .tied = true, .name = "ppo_tied_tp2_pp2"}, Case{.mtp = 1, .tied = true, .name = "tied_mtp"},
                      Case{.pipeline_parallel = 2, .expert_parallel = 2, .moe = true, .mtp = 1,
                           .fewer_samples_on_d1 = true, .micro_batches = 3, .name = "moe_mtp_pp2_ep2"},
                      Case{.pipeline_parallel = 2, .expert_parallel = 2, .moe = true, .mtp = 1,
                           .fewer_samples_on_d1 = true, .micro_batches = 3, .bf16 = true,
                           .name = "moe_mtp_pp2_ep2_bf16"},
                      Case{.context_parallel = 2, .pipeline_parallel = 2, .moe = true, .name = "moe_cp2_pp2"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace slimpi
