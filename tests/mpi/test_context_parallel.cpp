// Context parallelism at np 1, 2 and 4 (model/context_split.h), each part against one rank:
// - the split: Megatron's chunks i and 2c−1−i of every sequence, no padding, sequences
//   shorter than 2c tokens (some chunks empty, some ranks holding nothing);
// - its gathers, forward and backward, in fp64 against the concatenations and sums
//   written out here;
// - a whole trainer step (train/trainer.h) of a model split over a context group
//   (CP = np; TP 2 x CP 2, CP 2 x DP 2 and CP 2 x EP 2 at np 4) against the same step of
//   the whole model, data-parallel over the same data-parallel group: old and reference
//   log-probs, rollout and step metrics, every gradient (summed over the context group)
//   and updated weight, to fp32 round-off (attention runs per chunk, the products over
//   fewer rows), for grouped-query attention with q/k norms and biases, MoE with routing
//   replay and the auxiliary loss, latent attention, Gated DeltaNet layers, MTP depths,
//   PPO's critic, on-policy distillation's top-k term, bf16 forwards, the distributed
//   optimizer, activation recomputation, micro-batches of one sample (a rank with no token
//   of a micro-batch), chunks attending one at a time (two flash attentions merged);
//   under exact numerics (train.on_policy = "exact") the log-probs are the whole model's
//   bits;
// - the split trainer's checkpoint loads into the whole model (layout-free).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>

#include "split_step_checks.h"
#include "kernels/batch_invariant.h"
#include "model/context_split.h"
#include "parallel/device.h"
#include "parallel/mpi_comm.h"
#include "sync/whole_model.h"
#include "train/advantages.h"
#include "train/model_parallel.h"
#include "train/trainer.h"
#include "../support/tensor_checks.h"
#include "../support/tiny_model.h"

namespace slimpi {
namespace {

using testing::by_name;
using testing::expect_close;

TEST(ContextSplit, HoldsChunksIAndTheirMirror) {
  MpiComm comm(MPI_COMM_WORLD, "context_parallel");
  const int c = comm.size(), me = comm.rank();
  const std::vector<int64_t> lens = {1, 2, 3, 8 * c + 3, 4 * c, 5};
  const ContextSplit split({me, c, c > 1 ? &comm : nullptr}, lens, at::kCPU);
  // Every row's holder, written out from the definition: chunk j of a sequence of L
  // tokens is [⌊jL/2c⌋, ⌊(j+1)L/2c⌋), held by rank j (j < c) or 2c−1−j.
  std::vector<int64_t> mine;
  int64_t start = 0, held_by_all = 0;
  for (int64_t L : lens) {
    for (int64_t pos = 0; pos < L; ++pos) {
      int64_t j = 0;
      while ((j + 1) * L / (2 * c) <= pos) ++j;
      const int holder = int(j < c ? j : 2 * c - 1 - j);
      EXPECT_EQ(split.owner(start + pos), holder) << "sequence of " << L << ", position " << pos;
      if (holder == me) mine.push_back(start + pos);
    }
    start += L;
  }
  ASSERT_EQ(split.n_tokens(), start);
  EXPECT_TRUE(at::equal(split.local_rows(), at::tensor(mine, at::kLong)));
  // A one-token sequence sits on rank 0; the long ones are split evenly: c ranks each hold
  // 2 chunks of 2 (8c + 3) / 2c or so tokens.
  EXPECT_EQ(split.owner(0), 0);
  int64_t n = split.n_local();
  comm.allreduce(&n, 1, DType::I64, ReduceOp::Sum);
  held_by_all = n;
  EXPECT_EQ(held_by_all, start);
  // The chunks: positions within their sequence, local rows back to back.
  int64_t local = 0;
  for (const auto& ch : split.chunks()) {
    EXPECT_EQ(ch.local_start, local);
    EXPECT_LT(ch.begin, ch.end);
    local += ch.end - ch.begin;
  }
  EXPECT_EQ(local, split.n_local());
}

// The values rank r holds of a per-row tensor (fp64), known to every rank.
at::Tensor rows_of(const at::Tensor& whole, const at::Tensor& rows) { return whole.index_select(0, rows); }

TEST(ContextSplit, GathersForwardAndBackward) {
  MpiComm comm(MPI_COMM_WORLD, "context_parallel");
  const int c = comm.size(), me = comm.rank();
  const std::vector<int64_t> lens = {2, 4 * c + 1, 3};
  const ContextSplit split({me, c, c > 1 ? &comm : nullptr}, lens, at::kCPU);
  const int64_t T = split.n_tokens();
  at::Generator g = at::detail::createCPUGenerator(7);
  const at::Tensor whole = at::randn({T, 3}, g, at::kDouble);  // the same on every rank
  // Each rank's upstream gradient differs (its own loss's).
  at::Generator gr = at::detail::createCPUGenerator(uint64_t(100 + me));
  const at::Tensor upstream = at::randn({T, 3}, gr, at::kDouble);
  std::vector<at::Tensor> every_upstream;
  for (int r = 0; r < c; ++r) {
    at::Generator gx = at::detail::createCPUGenerator(uint64_t(100 + r));
    every_upstream.push_back(at::randn({T, 3}, gx, at::kDouble));
  }
  {  // rows: every row in packed order; each rank's rows get the gradient summed over the group
    at::Tensor x = rows_of(whole, split.local_rows()).clone().set_requires_grad(true);
    const at::Tensor y = split.gather_rows(x);
    EXPECT_TRUE(at::equal(y.detach(), whole));
    y.backward(upstream);
    at::Tensor want = at::zeros_like(whole);
    for (const auto& u : every_upstream) want += u;
    EXPECT_TRUE(at::allclose(x.grad(), rows_of(want, split.local_rows()), 1e-12, 1e-12));
  }
  {  // items: a subset of rows in their own order (scored positions); own gradient only
    const at::Tensor items = at::tensor(std::vector<int64_t>{T - 1, 0, 3, 1, T - 2}, at::kLong);
    const ContextSplit::Items it = split.items(items);
    const at::Tensor want = whole.index_select(0, items);  // [5, 3]
    at::Tensor x = want.index_select(0, it.local_items).clone().set_requires_grad(true);
    const at::Tensor y = split.gather_items(it, x);
    EXPECT_TRUE(at::equal(y.detach(), want));
    const at::Tensor u = upstream.narrow(0, 0, 5);
    y.backward(u);
    EXPECT_TRUE(at::equal(x.grad(), u.index_select(0, it.local_items)));
  }
}

// A small model of every kind the trainer runs (test_tensor_parallel's shapes).
struct Case {
  int tensor_parallel = 1, context_parallel = 0;  // 0: every rank
  int expert_parallel = 1;
  bool moe = false, mla = false, hybrid = false;
  int mtp = 0;
  bool ppo = false, distributed_optimizer = false, one_sample_micro_batches = false;
  bool opd_topk = false;  // on-policy distillation's top-k term (the samples carry a teacher's top-k)
  bool bf16 = false;
  bool unpadded = false;  // the split model's chunks attend one at a time (the long-sequence path)
  bool exact = false;     // exact numerics (train.on_policy = "exact"): log-probs bit for bit
  bool mtp_distill = false;  // the MTP loss as distillation of the trunk's top-k
  bool late_responses = false;  // every response in its sequence's last chunk (long prompts)
  Transformer::Recompute recompute = Transformer::Recompute::None;
  std::string name;
};

ModelConfig config_of(const Case& c) {
  ModelConfig m = testing::tiny_model_config(/*max_seq_len=*/48, /*init_std=*/0.1);
  m.n_heads = 8;
  m.n_kv_heads = 2;
  m.explicit_head_dim = 8;
  m.qk_norm = true;
  m.qkv_bias = true;
  m.o_bias = true;
  m.mtp_num_layers = c.mtp;
  if (c.moe) testing::use_split_test_moe(m);
  if (c.mla) testing::use_latent_attention(m);
  if (c.hybrid) {
    testing::use_gated_delta_net(m);
    m.linear_num_key_heads = 4;
    m.linear_num_value_heads = 8;
    m.qkv_bias = m.o_bias = false;
  }
  return m;
}

TrainerConfig trainer_config(const Case& c) {
  TrainerConfig t;
  t.mode = "rl";
  t.use_kl_loss = !c.ppo;
  t.kl_loss_coef = 0.1;
  t.kl_loss_type = "low_var_kl";
  t.entropy_coef = 0.01;
  t.normalize_advantages = !c.ppo;
  t.moe_aux_loss_coef = 0.01;
  t.routing_replay = c.moe;
  t.mtp_loss_coef = c.mtp > 0 ? 0.3 : 0.0;
  if (c.mtp_distill) {
    t.mtp_loss = "distill";
    t.mtp_distill_top_k = 4;
  }
  t.n_micro_batches = c.one_sample_micro_batches ? 5 : 2;
  t.clip_grad = 0.5;  // acts: the norm must count every parameter once
  t.lr.lr = 1e-2;
  t.adam.eps = 1e-3;
  t.grad_bucket_bytes = 1 << 12;
  t.distributed_optimizer = c.distributed_optimizer;
  t.recompute = c.recompute;
  t.opd_topk_loss_coef = c.opd_topk ? 0.5 : 0.0;
  t.opd_top_k = 3;
  t.precision = c.bf16 ? Precision::BF16 : Precision::FP32;
  if (c.ppo) {
    t.estimator = &advantage_estimators().get("ppo");
    t.gamma = 0.9;
    t.lambd = 0.8;
    t.critic.lr.lr = 1e-2;
    t.critic.seed = 5;
  }
  return t;
}

// The samples of data-parallel index `d`: lengths from 2 tokens (shorter than 2c) to 40,
// with routing traces (drawn expert ids) for MoE models.
std::vector<Sample> samples_of(int d, const ModelConfig& cfg, bool late_responses) {
  at::Generator g = at::detail::createCPUGenerator(400 + d);
  std::vector<Sample> out;
  const int64_t lengths[] = {2, 40, 9, 3, 23};
  for (int i = 0; i < 5; ++i) {
    Sample s;
    const int64_t len = lengths[i];
    at::Tensor tok = at::randint(259, {len}, g, at::kLong);
    s.tokens.assign(tok.data_ptr<int64_t>(), tok.data_ptr<int64_t>() + len);
    // (late responses: 3 tokens or fewer at the end, after the last rank's first chunk)
    s.prompt_length = late_responses ? std::max<int64_t>(len - 3, len * 7 / 8) : std::min<int64_t>(1 + i, len - 1);
    s.reward = at::randn({1}, g).item<float>();
    s.group_index = i;
    for (int64_t t = s.prompt_length; t < len; ++t)  // a teacher's top-3 at every response token
      for (int64_t j = 0; j < 3; ++j) {
        s.teacher_topk_ids.push_back((s.tokens[size_t(t)] + 37 * j) % 259);
        s.teacher_topk_probs.push_back(j == 0 ? 0.6f : 0.2f);
      }
    if (cfg.n_experts > 0) testing::add_routing_trace(s, cfg, i);
    out.push_back(s);
  }
  return out;
}

class ContextParallelStep : public ::testing::TestWithParam<Case> {};

TEST_P(ContextParallelStep, EqualsTheWholeModel) {
  MpiComm world(MPI_COMM_WORLD, "trainer");
  const int n = world.size();
  const Case c = GetParam();
  const int tp = c.tensor_parallel, cp = c.context_parallel == 0 ? n / tp : c.context_parallel;
  if (cp < 1 || n % (tp * cp) != 0 || (n / tp) % c.expert_parallel != 0 || (cp == 1 && n > 1))
    GTEST_SKIP() << c.name << " at np " << n;
  const ModelConfig cfg = config_of(c);
  struct ExactNumerics {  // the process-wide switch, for this case alone
    bool on;
    explicit ExactNumerics(bool on) : on(on) { set_exact_numerics(on); }
    ~ExactNumerics() { set_exact_numerics(false); }
  } exact_numerics_scope(c.exact);
  ModelParallel mp(MPI_COMM_WORLD, tp, c.expert_parallel, DeviceChoice{}, false, kv_head_replicas(cfg, tp), cp);
  ASSERT_EQ(mp.context_size(), cp);
  // bf16 forwards: the products over a rank's rows round to bf16 where the whole batch's
  // might not (another kernel for another row count): log-probs within a few bf16 ulps
  // of their magnitude (~6), weights and gradients within a tenth of their largest entry.
  const double logp_tol = c.bf16 ? 0.1 : 2e-5, metric_tol = c.bf16 ? 2e-2 : 2e-5;
  const int d = mp.data_index();
  const TrainerConfig tc = trainer_config(c);

  // The whole model, data-parallel over the same data-parallel group.
  Transformer whole(cfg, 1, at::kCPU), whole_ref(cfg, 2, at::kCPU);
  TrainerConfig whole_tc = tc;
  whole_tc.distributed_optimizer = false;
  whole_tc.recompute = Transformer::Recompute::None;
  Trainer base(whole_tc, whole, &mp.data(), c.ppo ? nullptr : &whole_ref);
  std::vector<Sample> want = samples_of(d, cfg, c.late_responses);
  const auto want_rollout = base.prepare_rollout(want, /*recompute_old=*/true);
  const auto want_step = base.train_step(want);
  const auto want_grads = by_name(whole.parameters(), true);
  const auto want_weights = by_name(whole.parameters(), false);

  Transformer shard(cfg, 1, at::kCPU, at::kFloat, mp.expert_shard(), mp.tensor_shard(), mp.context_shard());
  Transformer shard_ref(cfg, 2, at::kCPU, at::kFloat, mp.expert_shard(), mp.tensor_shard(), mp.context_shard());
  if (c.unpadded)
    for (Transformer* m : {&shard, &shard_ref}) m->set_padded_attention_budget(0);
  Trainer split(tc, shard, &mp.data(), c.ppo ? nullptr : &shard_ref, mp.expert_replicas(), &mp.replicas());
  std::vector<Sample> got = samples_of(d, cfg, c.late_responses);
  const auto got_rollout = split.prepare_rollout(got, /*recompute_old=*/true);
  for (size_t j = 0; j < got.size(); ++j)
    for (size_t i = 0; i < got[j].old_log_probs.size(); ++i) {
      EXPECT_NEAR(got[j].old_log_probs[i], want[j].old_log_probs[i], logp_tol) << c.name << " sample " << j;
      if (c.exact) {  // batch-invariant rows: the split gives the whole model's bits
        EXPECT_EQ(got[j].old_log_probs[i], want[j].old_log_probs[i]) << c.name << " sample " << j << " token " << i;
        EXPECT_EQ(got[j].ref_log_probs[i], want[j].ref_log_probs[i]) << c.name << " sample " << j << " token " << i;
      }
      if (!c.ppo) EXPECT_NEAR(got[j].ref_log_probs[i], want[j].ref_log_probs[i], logp_tol) << c.name;
      if (c.ppo) EXPECT_NEAR(got[j].values[i], want[j].values[i], 2e-5) << c.name << " value, sample " << j;
    }
  for (const auto& [k, x] : want_rollout)
    EXPECT_NEAR(got_rollout.at(k), x, metric_tol * std::max(1.0, std::abs(x))) << c.name << ": " << k;
  const auto got_step = split.train_step(got);
  testing::expect_metrics_near(got_step, want_step, metric_tol, c.name);
  if (cp > 1) {  // the ranks share the tokens (a check that the split is on)
    const auto split_of = shard.context_split({40});
    ASSERT_NE(split_of, nullptr);
    EXPECT_LT(split_of->n_local(), 40);
  }
  EXPECT_GT(want_step.at("train/grad_norm"), 0.5);  // the clip acted
  const StoredWhole stored{&cfg, mp.tensor_shard()};
  testing::expect_shard_matches_whole(shard, stored, want_grads, want_weights, c.bf16, !c.distributed_optimizer,
                                      c.name);
  if (c.ppo) {  // the critic's step too
    const auto want_critic = base.critic()->train_step(want), got_critic = split.critic()->train_step(got);
    for (const auto& [k, x] : want_critic)
      EXPECT_NEAR(got_critic.at(k), x, 1e-4 * std::max(1.0, std::abs(x))) << c.name << ": " << k;
  }

  testing::expect_checkpoint_loads_whole(split, shard, cfg, stored, whole_tc, c.name);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ContextParallelStep,
    ::testing::Values(Case{.name = "dense"}, Case{.one_sample_micro_batches = true, .name = "one_sample_micro_batches"},
                      Case{.recompute = Transformer::Recompute::Full, .name = "full_recompute"},
                      Case{.moe = true, .name = "deepseek_moe_replay"}, Case{.mla = true, .name = "latent_attention"},
                      Case{.hybrid = true, .name = "gated_delta_net"}, Case{.mtp = 2, .name = "mtp"},
                      Case{.mtp = 2, .mtp_distill = true, .late_responses = true, .name = "mtp_distill_late_responses"},
                      Case{.ppo = true, .name = "ppo_critic"}, Case{.opd_topk = true, .name = "opd_topk"},
                      Case{.bf16 = true, .name = "bf16"}, Case{.unpadded = true, .name = "unpadded_chunks"},
                      Case{.mla = true, .unpadded = true, .name = "latent_attention_unpadded_chunks"},
                      Case{.exact = true, .name = "exact"}, Case{.moe = true, .exact = true, .name = "moe_exact"},
                      Case{.mla = true, .exact = true, .name = "latent_attention_exact"},
                      Case{.hybrid = true, .exact = true, .name = "gated_delta_net_exact"},
                      Case{.bf16 = true, .exact = true, .name = "bf16_exact"},
                      Case{.context_parallel = 2, .distributed_optimizer = true, .name = "cp2_dp2_zero1"},
                      Case{.tensor_parallel = 2, .context_parallel = 2, .name = "tp2_cp2"},
                      Case{.context_parallel = 2, .expert_parallel = 2, .moe = true, .name = "cp2_ep2"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace slimpi
