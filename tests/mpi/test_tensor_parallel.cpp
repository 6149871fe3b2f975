// Tensor parallelism at np 1, 2 and 4, each part against one rank:
// - every mapping of parallel/tp_mappings.h, forward and backward, in fp64, against the
//   sums, slices and concatenations written out here;
// - vocab-parallel log-probs and entropies (model/vocab_parallel_log_probs.h) against
//   score_tokens on the whole logits: targets in every shard, a padded vocabulary whose
//   padding holds large garbage, a temperature, top-k supports, and the gradients;
// - a whole trainer step (train/trainer.h) of a model split over the tensor group
//   (ModelParallel: TP = np, and TP 2 x DP 2 at np 4, with an MoE layer under expert
//   parallelism there) against the same step of the whole model: loss, metrics,
//   log-probs, every shard's gradient and updated weights equal the whole model's
//   slices (to fp32 round-off: the row-parallel products sum in another order), for
//   grouped-query attention with q/k norms and biases, tied and untied embeddings;
// - the same with sequence parallelism (the residual stream split over the group), and
//   with the distributed optimizer at TP 2 x DP 2, and with activation recomputation
//   (selective, full);
// - its checkpoint holds whole tensors (the padding dropped) and loads back into the
//   whole model and into the shards, and gathering the shards gives the whole model.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <limits>
#include <map>

#include "shared_tmp.h"
#include "io/h5.h"
#include "io/tensor_io.h"
#include "model/head_log_probs.h"
#include "model/log_probs.h"
#include "model/linear_channels.h"
#include "model/tensor_shard.h"
#include "model/vocab_parallel_log_probs.h"
#include "parallel/comm_tensor.h"
#include "parallel/device.h"
#include "parallel/mpi_comm.h"
#include "parallel/tp_mappings.h"
#include "train/model_parallel.h"
#include "train/trainer.h"
#include "sync/whole_model.h"
#include "../support/tensor_checks.h"
#include "../support/tiny_model.h"

namespace slimpi {
namespace {

using testing::by_name;
using testing::expect_close;

// A tensor only rank `r` would hold, known to every rank (fp64).
at::Tensor of_rank(int r, std::vector<int64_t> shape, int salt) {
  at::Generator g = at::detail::createCPUGenerator(uint64_t(1000 * salt + r));
  return at::randn(shape, g, at::kDouble);
}

at::Tensor sum_over_ranks(int n, std::vector<int64_t> shape, int salt) {
  at::Tensor s = at::zeros(shape, at::kDouble);
  for (int r = 0; r < n; ++r) s += of_rank(r, shape, salt);
  return s;
}

at::Tensor cat_over_ranks(int n, std::vector<int64_t> shape, int salt, int64_t dim) {
  std::vector<at::Tensor> parts;
  for (int r = 0; r < n; ++r) parts.push_back(of_rank(r, shape, salt));
  return at::cat(parts, dim);
}

void expect_equal_fp64(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(at::allclose(got, want, 1e-12, 1e-12)) << what << ": max |diff| " << (got - want).abs().max().item<double>();
}

TEST(TensorParallelMappings, ForwardAndBackwardAgainstOneRank) {
  MpiComm comm(MPI_COMM_WORLD, "tensor_parallel");
  const int r = comm.rank(), t = comm.size();
  const int64_t rows = 4 * t, cols = 3 * t;  // split evenly over any group size
  auto run = [&](const std::function<at::Tensor(const at::Tensor&)>& f, const at::Tensor& input,
                 const at::Tensor& upstream) {
    at::Tensor x = input.clone().set_requires_grad(true);
    at::Tensor y = f(x);
    y.backward(upstream);
    return std::pair{y.detach(), x.grad()};
  };
  const at::Tensor same = of_rank(99, {rows, cols}, 1);  // the same input on every rank
  {  // copy: identity forward, gradients summed
    auto [y, dx] = run([&](auto& x) { return copy_to_tp(&comm, x); }, same, of_rank(r, {rows, cols}, 2));
    expect_equal_fp64(y, same, "copy_to_tp forward");
    expect_equal_fp64(dx, sum_over_ranks(t, {rows, cols}, 2), "copy_to_tp backward");
  }
  {  // reduce: summed forward, identity backward
    auto [y, dx] = run([&](auto& x) { return reduce_from_tp(&comm, x); }, of_rank(r, {rows, cols}, 3), same);
    expect_equal_fp64(y, sum_over_ranks(t, {rows, cols}, 3), "reduce_from_tp forward");
    expect_equal_fp64(dx, same, "reduce_from_tp backward");
  }
  {  // scatter over the last dim; gradients gathered back
    auto [y, dx] = run([&](auto& x) { return scatter_to_tp(&comm, x); }, same, of_rank(r, {rows, 3}, 4));
    expect_equal_fp64(y, same.narrow(1, 3 * r, 3), "scatter_to_tp forward");
    expect_equal_fp64(dx, cat_over_ranks(t, {rows, 3}, 4, 1), "scatter_to_tp backward");
  }
  {  // gather over the last dim; each rank's gradient slice
    auto [y, dx] = run([&](auto& x) { return gather_from_tp(&comm, x); }, of_rank(r, {rows, 3}, 5), same);
    expect_equal_fp64(y, cat_over_ranks(t, {rows, 3}, 5, 1), "gather_from_tp forward");
    expect_equal_fp64(dx, same.narrow(1, 3 * r, 3), "gather_from_tp backward");
  }
  {  // sequence scatter (dim 0); gradients gathered back
    auto [y, dx] = run([&](auto& x) { return scatter_to_sequence(&comm, x); }, same, of_rank(r, {4, cols}, 6));
    expect_equal_fp64(y, same.narrow(0, 4 * r, 4), "scatter_to_sequence forward");
    expect_equal_fp64(dx, cat_over_ranks(t, {4, cols}, 6, 0), "scatter_to_sequence backward");
  }
  {  // sequence gather; gradients reduce-scattered
    auto [y, dx] = run([&](auto& x) { return gather_from_sequence(&comm, x); }, of_rank(r, {4, cols}, 7),
                       of_rank(r, {rows, cols}, 8));
    expect_equal_fp64(y, cat_over_ranks(t, {4, cols}, 7, 0), "gather_from_sequence forward");
    expect_equal_fp64(dx, sum_over_ranks(t, {rows, cols}, 8).narrow(0, 4 * r, 4), "gather_from_sequence backward");
  }
  {  // reduce-scatter over the sequence; gradients gathered
    auto [y, dx] = run([&](auto& x) { return reduce_scatter_to_sequence(&comm, x); }, of_rank(r, {rows, cols}, 9),
                       of_rank(r, {4, cols}, 10));
    expect_equal_fp64(y, sum_over_ranks(t, {rows, cols}, 9).narrow(0, 4 * r, 4), "reduce_scatter_to_sequence forward");
    expect_equal_fp64(dx, cat_over_ranks(t, {4, cols}, 10, 0), "reduce_scatter_to_sequence backward");
  }
  // A null or one-rank group is the identity (no collective).
  const at::Tensor x = same.clone();
  EXPECT_TRUE(copy_to_tp(nullptr, x).is_same(x));
  EXPECT_TRUE(reduce_from_tp(nullptr, x).is_same(x));
}

TEST(VocabParallelLogProbs, EqualWholeVocabularyLogSoftmax) {
  MpiComm comm(MPI_COMM_WORLD, "tensor_parallel");
  const int r = comm.rank(), t = comm.size();
  const int64_t V = 260, Vp = padded_vocab_size(V, t), T = 12;
  at::Generator g = at::detail::createCPUGenerator(5);
  const at::Tensor whole = at::randn({T, V}, g, at::kFloat) * 3.0;  // the same on every rank
  ScoredPositions at;
  at.logit_rows = at::tensor(std::vector<int64_t>{0, 1, 2, 3, 5, 6, 8, 9, 10, 11}, at::kLong);
  at.targets = at::tensor(std::vector<int64_t>{0, 127, 128, 200, 255, 256, 259, 3, 130, 258}, at::kLong);
  // Padded columns hold garbage larger than any real logit: only the masking hides them.
  const at::Tensor padded = at::cat({whole, at::full({T, Vp - V}, 50.0f)}, 1);
  const int64_t columns = Vp / t;
  const VocabShard shard{t > 1 ? &comm : nullptr, columns * r, std::clamp<int64_t>(V - columns * r, 0, columns)};
  for (const bool truncated : {false, true}) {
    SCOPED_TRACE(truncated ? "top-k supports" : "whole vocabulary");
    const at::Tensor support =
        truncated ? at::tensor(std::vector<int64_t>{5, 0, 1, 40, 5, 0, 300, 2, 7, 0}, at::kLong) : at::Tensor();
    for (const double temperature : {1.0, 0.7}) {
      at::Tensor want_in = whole.clone().set_requires_grad(true);
      const TokenLogProbs want = score_tokens(want_in, at, temperature, true, support);
      at::Tensor got_in = padded.narrow(1, columns * r, columns).clone().set_requires_grad(true);
      const TokenLogProbs got = t == 1 ? score_tokens(got_in, at, temperature, true, support)
                                       : score_tokens_vocab_parallel(got_in, at, temperature, true, support, shard);
      EXPECT_TRUE(at::allclose(got.logp, want.logp, 1e-5, 1e-5)) << (got.logp - want.logp).abs().max();
      EXPECT_TRUE(at::allclose(got.entropy, want.entropy, 1e-5, 1e-5)) << (got.entropy - want.entropy).abs().max();
      // d/dz of Σ a·logp + Σ b·entropy.
      const at::Tensor a = at::linspace(0.5, 1.5, 10), b = at::linspace(-1.0, 1.0, 10);
      ((want.logp * a).sum() + (want.entropy * b).sum()).backward();
      ((got.logp * a).sum() + (got.entropy * b).sum()).backward();
      const at::Tensor want_grad = at::cat({want_in.grad(), at::zeros({T, Vp - V})}, 1).narrow(1, columns * r, columns);
      EXPECT_TRUE(at::allclose(got_in.grad(), want_grad, 1e-5, 1e-6)) << (got_in.grad() - want_grad).abs().max();
    }
  }
}

TEST(HeadLogProbs, EqualTheLogitsPath) {
  // The LM head's product inside the chunked log-prob function (no [N, V] logits) against
  // the head applied first and score_tokens on the whole logits: values and the gradients
  // of the head's input and weight; whole vocabulary (np 1) or split over the ranks.
  MpiComm comm(MPI_COMM_WORLD, "tensor_parallel");
  const int r = comm.rank(), t = comm.size();
  const int64_t V = 260, Vp = padded_vocab_size(V, t), T = 12, d = 16, columns = Vp / t;
  at::Generator g = at::detail::createCPUGenerator(11);
  const at::Tensor hidden = at::randn({T, d}, g, at::kFloat), head = at::randn({V, d}, g, at::kFloat) * 0.5;
  ScoredPositions at;
  at.logit_rows = at::tensor(std::vector<int64_t>{0, 2, 3, 5, 7, 8, 11}, at::kLong);
  at.targets = at::tensor(std::vector<int64_t>{0, 130, 255, 256, 259, 7, 199}, at::kLong);
  const VocabShard shard{t > 1 ? &comm : nullptr, columns * r, std::clamp<int64_t>(V - columns * r, 0, columns)};
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 products" : "fp32");
    at::Tensor h_want = hidden.clone().set_requires_grad(true), w_want = head.clone().set_requires_grad(true);
    // bf16: the operands and the product rounded as the bf16 product rounds them, the
    // gradient passing straight through each rounding (fp32 products of the rounded
    // operands: what the fused backward computes).
    auto rounded = [&](const at::Tensor& x) {
      return bf16 ? x + (x.to(at::kBFloat16).to(at::kFloat) - x).detach() : x;
    };
    const at::Tensor logits = rounded(at::matmul(rounded(h_want), rounded(w_want).t()));
    const TokenLogProbs want = score_tokens(logits, at, 0.8, true);
    const at::Tensor padded_head = at::cat({head, at::zeros({Vp - V, d})}, 0);
    at::Tensor h_got = hidden.clone().set_requires_grad(true);
    at::Tensor w_got = padded_head.narrow(0, columns * r, columns).clone().set_requires_grad(true);
    const TokenLogProbs got = head_log_probs(h_got, t == 1 ? w_got.narrow(0, 0, V) : w_got, at, 0.8, true, {}, shard, bf16);
    const double tol = bf16 ? 1e-4 : 1e-5;
    EXPECT_TRUE(at::allclose(got.logp, want.logp, tol, tol)) << (got.logp - want.logp).abs().max();
    EXPECT_TRUE(at::allclose(got.entropy, want.entropy, tol, tol)) << (got.entropy - want.entropy).abs().max();
    const at::Tensor a = at::linspace(0.5, 1.5, 7), b = at::linspace(-1.0, 1.0, 7);
    ((want.logp * a).sum() + (want.entropy * b).sum()).backward();
    ((got.logp * a).sum() + (got.entropy * b).sum()).backward();
    // The head's input gets one part per shard (copy_to_tp sums them in the model).
    const double gtol = 1e-4;
    at::Tensor dh = h_got.grad().clone();
    if (t > 1) allreduce(comm, dh);
    EXPECT_TRUE(at::allclose(dh, h_want.grad(), gtol, 1e-2 * gtol)) << (dh - h_want.grad()).abs().max();
    const at::Tensor dw_want = at::cat({w_want.grad(), at::zeros({Vp - V, d})}, 0).narrow(0, columns * r, columns);
    EXPECT_TRUE(at::allclose(w_got.grad(), dw_want, gtol, 1e-2 * gtol)) << (w_got.grad() - dw_want).abs().max();
  }
}

// The model of a case: grouped-query attention (2 key/value heads where the group
// allows it, or `kv_heads`: fewer than t replicates them) with q/k norms and q/k/v
// biases; tied or untied; with one MoE layer (and Qwen2-MoE's gated shared expert, split
// over the group as a dense MLP).
// deepseek: GLM-4.5's shape of it: RoPE over half of each head, and the MoE layer
// DeepSeekMoE's (sigmoid router with a correction bias, 2 groups of which a token uses 1,
// weights scaled by 2.5, one ungated shared expert split as a dense MLP; layer 0 dense by
// first_k_dense_replace).
// mla: DeepSeek-V3's multi-head latent attention (a query latent, interleaved rotary
// pairs, values narrower than keys; no biases or q/k norms).
// hybrid: Qwen3.5's shape (tiny_model.h, use_gated_delta_net): layers 0-2 Gated DeltaNet
// with 4 key heads shared by 8 value heads (split by key heads over 1, 2 or 4 ranks),
// layer 3 gated full attention; with moe, Qwen3.5-MoE's (layers 1 and 3 sparse, the gated
// shared expert); fused: Qwen3-Next's fused projections (in_proj_qkvz, in_proj_ba).
ModelConfig tp_config(int t, bool tied, bool moe, int kv_heads = 0, int mtp = 0, bool deepseek = false,
                      bool mla = false, bool hybrid = false, bool fused = false) {
  ModelConfig c = testing::tiny_model_config(/*max_seq_len=*/32, /*init_std=*/0.1);
  c.n_heads = 8;
  c.n_kv_heads = kv_heads > 0 ? kv_heads : std::max(2, t);
  c.explicit_head_dim = 8;
  c.qk_norm = true;
  c.qkv_bias = true;
  c.o_bias = true;
  c.tie_word_embeddings = tied;
  c.mtp_num_layers = mtp;  // MTP depths: split as the trunk's layers, trained beside them
  if (moe) {
    c.n_experts = 4;
    c.n_experts_per_tok = 2;
    c.moe_intermediate_size = 16;
    c.moe_layer_freq = 2;  // layer 1 sparse, layer 0 dense
    if (!deepseek) c.shared_expert_intermediate_size = 8;  // Qwen2-MoE's gated shared expert
  }
  if (deepseek) {
    c.partial_rotary_factor = 0.5;
    c.moe_layer_freq = 1;
    testing::use_deepseek_moe(c, /*n_group=*/2, /*topk_group=*/1, /*first_k_dense=*/1);
  }
  if (mla) testing::use_latent_attention(c);
  if (hybrid) {
    testing::use_gated_delta_net(c);
    c.linear_num_key_heads = 4;
    c.linear_num_value_heads = 8;
    c.qkv_bias = c.o_bias = false;  // (Qwen3.5's attention has none)
    c.linear_fused_projections = fused;
  }
  return c;
}

TrainerConfig rl_config() {
  TrainerConfig c;
  c.mode = "rl";
  c.use_kl_loss = true;
  c.kl_loss_coef = 0.1;
  c.kl_loss_type = "low_var_kl";
  c.entropy_coef = 0.01;
  c.normalize_advantages = true;
  c.moe_aux_loss_coef = 0.01;
  c.n_micro_batches = 2;
  c.clip_grad = 0.5;  // acts: the norm must count every parameter once
  c.lr.lr = 1e-2;
  c.adam.eps = 1e-3;  // keeps the comparison about the gradients (see test_expert_parallel)
  c.grad_bucket_bytes = 1 << 12;
  return c;
}

// The samples of data-parallel index `d`.
std::vector<Sample> samples_of(int d) {
  at::Generator g = at::detail::createCPUGenerator(300 + d);
  std::vector<Sample> out;
  for (int i = 0; i < 3; ++i) {
    Sample s;
    const int64_t len = 6 + at::randint(10, {1}, g, at::kLong).item<int64_t>();
    at::Tensor tok = at::randint(259, {len}, g, at::kLong);  // every vocabulary shard
    s.tokens.assign(tok.data_ptr<int64_t>(), tok.data_ptr<int64_t>() + len);
    s.prompt_length = 2 + i;
    s.reward = at::randn({1}, g).item<float>();
    out.push_back(s);
  }
  return out;
}

struct Case {
  int tensor_parallel;  // 0: every rank
  int expert_parallel;
  bool tied, moe;
  bool sequence_parallel = false;
  bool distributed_optimizer = false;
  Transformer::Recompute recompute = Transformer::Recompute::None;
  int kv_heads = 0;  // > 0: the model's key/value heads (fewer than the group: replicated)
  int mtp = 0;       // MTP depths (train/mtp_loss.h)
  bool deepseek = false;  // DeepSeekMoE and partial RoPE (tp_config)
  bool mla = false;       // multi-head latent attention (tp_config)
  bool hybrid = false;    // Gated DeltaNet layers (tp_config)
  bool fused = false;     // their projections fused as Qwen3-Next's (tp_config)
};

// DeepSeekMoE's correction biases (zero at init) set to values that move choices, the
// same in every model of a case.
void set_score_biases(Transformer& m) {
  at::NoGradGuard no_grad;
  for (auto& p : m.parameters())
    if (p.name.find("e_score_correction_bias") != std::string::npos)
      p.tensor.copy_(at::linspace(0.3, -0.2, p.tensor.numel(), at::kFloat));
}

class TensorParallelStep : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelStep, EqualsTheWholeModel) {
  MpiComm world(MPI_COMM_WORLD, "trainer");
  const int n = world.size();
  const Case c = GetParam();
  const int tp = c.tensor_parallel == 0 ? n : c.tensor_parallel;
  if (n % tp != 0 || (n / tp) % c.expert_parallel != 0 || (c.expert_parallel > 1 && !c.moe) || (tp == 1 && n > 1) ||
      (c.sequence_parallel && tp == 1))
    GTEST_SKIP() << "TP " << tp << " x EP " << c.expert_parallel << " at np " << n;
  const ModelConfig cfg = tp_config(tp, c.tied, c.moe, c.kv_heads, c.mtp, c.deepseek, c.mla, c.hybrid, c.fused);
  ModelParallel mp(MPI_COMM_WORLD, tp, c.expert_parallel, DeviceChoice{}, c.sequence_parallel,
                   kv_head_replicas(cfg, tp));
  const int d = mp.data_index();

  // The whole model, data-parallel over the same data-parallel group.
  Transformer whole(cfg, 1, at::kCPU), whole_ref(cfg, 2, at::kCPU);
  set_score_biases(whole);
  set_score_biases(whole_ref);
  Trainer base(rl_config(), whole, &mp.data(), &whole_ref);
  std::vector<Sample> want = samples_of(d);
  auto want_rollout = base.prepare_rollout(want, /*recompute_old=*/true);
  auto want_step = base.train_step(want);
  const auto want_grads = by_name(whole.parameters(), true);
  const auto want_weights = by_name(whole.parameters(), false);

  Transformer shard(cfg, 1, at::kCPU, at::kFloat, mp.expert_shard(), mp.tensor_shard());
  Transformer shard_ref(cfg, 2, at::kCPU, at::kFloat, mp.expert_shard(), mp.tensor_shard());
  set_score_biases(shard);
  set_score_biases(shard_ref);
  if (tp > 1) ASSERT_LT(shard.n_params(), whole.n_params());
  TrainerConfig split_cfg = rl_config();
  split_cfg.distributed_optimizer = c.distributed_optimizer;
  split_cfg.recompute = c.recompute;
  Trainer split(split_cfg, shard, &mp.data(), &shard_ref, mp.expert_replicas());
  std::vector<Sample> got = samples_of(d);
  auto got_rollout = split.prepare_rollout(got, /*recompute_old=*/true);
  for (size_t j = 0; j < got.size(); ++j)
    for (size_t i = 0; i < got[j].old_log_probs.size(); ++i) {
      EXPECT_NEAR(got[j].old_log_probs[i], want[j].old_log_probs[i], 2e-5);
      EXPECT_NEAR(got[j].ref_log_probs[i], want[j].ref_log_probs[i], 2e-5);
    }
  for (const auto& [k, x] : want_rollout) EXPECT_NEAR(got_rollout.at(k), x, 1e-5 * std::max(1.0, std::abs(x))) << k;
  auto got_step = split.train_step(got);
  for (const auto& [k, x] : want_step) {
    if (k.rfind("perf/", 0) == 0) continue;
    EXPECT_NEAR(got_step.at(k), x, 1e-5 * std::max(1.0, std::abs(x))) << k;
  }
  EXPECT_GT(want_step.at("train/grad_norm"), 0.5);  // the clip acted
  for (const auto& p : whole.parameters())  // DeepSeekMoE's correction bias is never trained
    if (p.name.find("e_score_correction_bias") != std::string::npos)
      EXPECT_TRUE(at::equal(p.tensor, at::linspace(0.3, -0.2, p.tensor.numel(), at::kFloat))) << p.name;
  const StoredWhole stored{&cfg, mp.tensor_shard()};
  for (const auto& p : shard.parameters()) {
    // (The distributed optimizer sums the gradients into its chunks; .grad() keeps this rank's own.)
    if (!c.distributed_optimizer)
      expect_close(p.tensor.grad(), stored.part_of(p.name, want_grads.at(p.name)), "gradient of " + p.name);
    expect_close(p.tensor.detach(), stored.part_of(p.name, want_weights.at(p.name)), "updated " + p.name);
  }
  if (const int rep = kv_head_replicas(cfg, tp); rep > 1) {
    // The replicas of a key/value head hold the same gradients, so they stay equal, bit for bit.
    ASSERT_NE(mp.tensor_shard().kv_replicas, nullptr);
    Comm& replicas = *mp.tensor_shard().kv_replicas;
    EXPECT_EQ(replicas.size(), rep);
    for (const auto& p : shard.parameters()) {
      if (parameter_split(p.name, cfg, tp).replicas == 1) continue;
      at::Tensor mine = p.tensor.detach().clone(), first = mine.clone();
      replicas.broadcast(first.data_ptr(), size_t(first.numel()), DType::F32, 0);
      EXPECT_TRUE(at::equal(mine, first)) << p.name << " differs between its replicas";
    }
  }

  // The checkpoint holds whole tensors, as the whole model's does.
  const testing::SharedTmpDir scratch;  // its own: np variants and reruns may run at once
  const std::string& dir = scratch.path();
  world.barrier();
  const std::string base_path = dir + "/base.h5", split_path = dir + "/split.h5";
  if (world.rank() == 0) base.save(base_path);
  split.save(split_path, MPI_COMM_WORLD);  // every rank writes its own part
  world.barrier();
  if (world.rank() == 0) {
    h5::File a = h5::File::open(base_path, false, MPI_COMM_NULL), b = h5::File::open(split_path, false, MPI_COMM_NULL);
    h5::Handle ma = h5::open_group(a.id(), "model"), mb = h5::open_group(b.id(), "model");
    h5::Handle oa = h5::open_group(a.id(), "optimizer"), ob = h5::open_group(b.id(), "optimizer");
    // One Adam step from zero moments: exp_avg = (1-b1)·g and exp_avg_sq = (1-b2)·g², g the
    // clipped gradient. The gradients agree to rtol 1e-4, atol 1e-6 (above; the clip scales
    // them by at most 1), so exp_avg to rtol 1e-4, atol (1-b1)·1e-6, and, as d(g²) = 2|g|·dg,
    // exp_avg_sq to rtol 2e-4 (+ the square of the relative part), atol (1-b2)·2·max|g|·1e-6.
    // (Summing a gradient in another order moves it by round-off of its largest terms, not of
    // itself: an element that cancels to ~0 differs absolutely, hence the atol.)
    const AdamWOptions adam = rl_config().adam;
    for (const auto& p : whole.parameters()) {
      expect_close(read_tensor(mb.id(), p.name), read_tensor(ma.id(), p.name), "stored " + p.name);
      const double g_max = want_grads.at(p.name).abs().max().item<double>();
      expect_close(read_tensor(ob.id(), "exp_avg/" + p.name), read_tensor(oa.id(), "exp_avg/" + p.name),
                   "stored exp_avg/" + p.name, 1e-4, (1 - adam.beta1) * 1e-6);
      expect_close(read_tensor(ob.id(), "exp_avg_sq/" + p.name), read_tensor(oa.id(), "exp_avg_sq/" + p.name),
                   "stored exp_avg_sq/" + p.name, 2.01e-4, (1 - adam.beta2) * 2 * g_max * 1e-6);
    }
  }
  // The split checkpoint loads into the whole model, the whole one into fresh shards.
  TrainerConfig no_kl = rl_config();
  no_kl.use_kl_loss = false;
  Transformer whole_again(cfg, 7, at::kCPU);
  Trainer whole_reloaded(no_kl, whole_again, &mp.data());
  whole_reloaded.load(split_path);
  for (const auto& p : whole_again.parameters()) expect_close(p.tensor.detach(), want_weights.at(p.name), "loaded " + p.name);
  Transformer fresh(cfg, 7, at::kCPU, at::kFloat, mp.expert_shard(), mp.tensor_shard());
  TrainerConfig reload_cfg = no_kl;
  reload_cfg.distributed_optimizer = c.distributed_optimizer;
  Trainer reloaded(reload_cfg, fresh, &mp.data(), nullptr, mp.expert_replicas());
  reloaded.load(base_path);
  for (const auto& p : fresh.parameters())
    EXPECT_TRUE(at::equal(p.tensor, stored.part_of(p.name, want_weights.at(p.name)))) << "loaded " << p.name;
  EXPECT_EQ(reloaded.n_steps(), 1);
  // Gathering the shards gives the whole model (into a bf16 copy: rounded once).
  Transformer gathered(cfg, 9, at::kCPU, at::kBFloat16);
  gather_whole_model(fresh, &gathered);
  for (const auto& p : gathered.parameters())
    EXPECT_TRUE(at::equal(p.tensor, want_weights.at(p.name).to(at::kBFloat16))) << "gathered " << p.name;

  // An inf in the part one rank writes (the last tensor rank's rows of q_proj): that rank
  // throws, every rank gets through the collective calls, and no file is left.
  const int bad_rank = tp > 1 ? tp - 1 : 0;
  const std::string poisoned = cfg.is_hybrid() ? std::string("model.layers.0.linear_attn.") +
                                                     (cfg.linear_fused_projections ? "in_proj_qkvz" : "in_proj_qkv") +
                                                     ".weight"
                               : std::string("model.layers.0.self_attn.") +
                                     (cfg.q_lora_rank > 0 ? "q_b_proj" : "q_proj") + ".weight";
  for (const auto& p : shard.parameters())
    if (world.rank() == bad_rank && p.name == poisoned) {
      at::NoGradGuard no_grad;
      p.tensor.view(-1)[0] = std::numeric_limits<float>::infinity();
    }
  const std::string bad_path = dir + "/bad.h5";
  bool threw = false;
  try {
    split.save(bad_path, MPI_COMM_WORLD);
  } catch (const Error& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find(poisoned + " holds NaN or inf"), std::string::npos) << e.what();
  }
  EXPECT_EQ(threw, world.rank() == bad_rank);
  world.barrier();
  EXPECT_FALSE(std::filesystem::exists(bad_path));
  world.barrier();
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelStep,
                         ::testing::Values(Case{0, 1, false, false}, Case{0, 1, true, false}, Case{0, 1, false, true},
                                           Case{2, 1, false, false}, Case{2, 2, false, true},
                                           // sequence parallel: the packed micro-batches' token counts are
                                           // not multiples of the group size (the stream is padded)
                                           Case{0, 1, false, false, true}, Case{0, 1, true, true, true},
                                           Case{2, 2, false, true, true},
                                           // the distributed optimizer over the data-parallel groups (and the
                                           // experts' replicas)
                                           Case{2, 1, true, false, false, true}, Case{2, 2, false, true, true, true},
                                           // activation recomputation (against the whole model without it)
                                           Case{0, 1, false, true, false, false, Transformer::Recompute::Full},
                                           Case{0, 1, true, false, true, false, Transformer::Recompute::Selective},
                                           Case{2, 2, false, true, true, true, Transformer::Recompute::Full},
                                           // key/value heads replicated: 2 over a group of 4, 1 over every
                                           // group (with sequence parallelism and the distributed optimizer)
                                           Case{0, 1, false, false, false, false, Transformer::Recompute::None, 2},
                                           Case{0, 1, true, false, true, true, Transformer::Recompute::None, 1},
                                           Case{2, 1, false, false, false, true, Transformer::Recompute::Full, 1},
                                           // two MTP depths trained beside the policy (with sequence
                                           // parallelism, the distributed optimizer and expert parallelism)
                                           Case{0, 1, false, false, false, false, Transformer::Recompute::None, 0, 2},
                                           Case{2, 2, true, true, true, true, Transformer::Recompute::None, 0, 1},
                                           // DeepSeekMoE and partial RoPE (GLM-4.5's shape): whole, and TP 2 x
                                           // EP 2 with sequence parallelism, the distributed optimizer and an
                                           // MTP depth (an MoE layer, as GLM-4.5's)
                                           Case{0, 1, false, true, false, false, Transformer::Recompute::None, 0, 0,
                                                true},
                                           Case{2, 2, false, true, true, true, Transformer::Recompute::Full, 0, 1,
                                                true},
                                           // DeepSeek-V3's shape: multi-head latent attention (heads split, the
                                           // latents whole) with DeepSeekMoE, whole and TP x EP 2 + SP + ZeRO-1
                                           // with selective recomputation and an MTP depth
                                           Case{0, 1, false, true, false, false, Transformer::Recompute::None, 0, 0,
                                                true, true},
                                           Case{2, 2, true, true, true, true, Transformer::Recompute::Selective, 0, 1,
                                                true, true},
                                           Case{0, 1, false, false, true, true, Transformer::Recompute::Full, 0, 0,
                                                false, true},
                                           // Qwen3.5's hybrid layers (Gated DeltaNet split by key heads): whole;
                                           // with sequence parallelism, the distributed optimizer and full
                                           // recomputation; Qwen3.5-MoE's at TP 2 x EP 2; Qwen3-Next's fused
                                           // projections with an MTP depth (an MoE layer)
                                           Case{.tensor_parallel = 0, .expert_parallel = 1, .tied = false,
                                                .moe = false, .hybrid = true},
                                           Case{.tensor_parallel = 0, .expert_parallel = 1, .tied = true,
                                                .moe = false, .sequence_parallel = true,
                                                .distributed_optimizer = true,
                                                .recompute = Transformer::Recompute::Full, .hybrid = true},
                                           Case{.tensor_parallel = 2, .expert_parallel = 2, .tied = false,
                                                .moe = true, .sequence_parallel = true, .hybrid = true},
                                           Case{.tensor_parallel = 0, .expert_parallel = 1, .tied = false,
                                                .moe = true, .mtp = 1, .hybrid = true, .fused = true}));

// The gradient norm counts every element once whatever the layout, at the shape where it
// moved (inputs/sft_addition.toml with d 256, 2 layers, vocabulary 32000: np 1 11.534529,
// TP 2 11.535199, ZeRO-1 11.536138). ATen's fp32 norm accumulates an 8M-element buffer in
// fp32 lanes and rounds differently for every split of it; the norm is now summed in fp64
// (train/grad_buffer.h), so the layouts differ only by the gradients' own round-off
// (~1e-7 relative). One SFT step: np 1 = TP = ZeRO-1 = TP 2 x DP 2 + SP + ZeRO-1 to 1e-6.
TEST(GradNorm, SameAtEveryLayoutAtSftAdditionScale) {
  MpiComm world(MPI_COMM_WORLD, "trainer");
  const int n = world.size();
  ModelConfig cfg = testing::tiny_model_config(/*max_seq_len=*/64, /*init_std=*/0.02);
  cfg.vocab_size = 32000;
  cfg.hidden_size = 256;
  cfg.n_heads = 4;
  cfg.n_kv_heads = 4;
  cfg.intermediate_size = 512;
  TrainerConfig tc;
  tc.mode = "sft";
  tc.calculate_per_token_loss = true;
  tc.lr.lr = 1e-3;
  at::Generator g = at::detail::createCPUGenerator(11);
  std::vector<Sample> all;
  for (int i = 0; i < 8; ++i) {
    Sample s;
    const int64_t len = 24 + at::randint(16, {1}, g, at::kLong).item<int64_t>();
    at::Tensor tok = at::randint(cfg.vocab_size, {len}, g, at::kLong);
    s.tokens.assign(tok.data_ptr<int64_t>(), tok.data_ptr<int64_t>() + len);
    s.prompt_length = 8;
    all.push_back(s);
  }
  Transformer whole(cfg, 1, at::kCPU);
  Trainer one(tc, whole, nullptr);
  const auto want = one.train_step(all);
  const double want_norm = want.at("train/grad_norm");
  EXPECT_GT(want_norm, 1.0);

  // One step of the layout (tensor size tp over `comm`, the rest data-parallel).
  auto step = [&](MPI_Comm comm, int tp, bool sequence_parallel, bool zero) {
    ModelParallel mp(comm, tp, 1, DeviceChoice{}, sequence_parallel, kv_head_replicas(cfg, tp));
    Transformer shard(cfg, 1, at::kCPU, at::kFloat, mp.expert_shard(), mp.tensor_shard());
    TrainerConfig c = tc;
    c.distributed_optimizer = zero;
    Trainer trainer(c, shard, &mp.data(), nullptr, mp.expert_replicas());
    const int64_t dp = mp.data_size(), d = mp.data_index(), N = int64_t(all.size());
    std::vector<Sample> mine(all.begin() + N * d / dp, all.begin() + N * (d + 1) / dp);
    return trainer.train_step(mine);
  };
  auto expect_same = [&](const std::map<std::string, double>& got, const std::string& layout) {
    EXPECT_NEAR(got.at("train/grad_norm"), want_norm, 1e-6 * want_norm) << layout;
    EXPECT_NEAR(got.at("train/loss"), want.at("train/loss"), 1e-6 * std::abs(want.at("train/loss"))) << layout;
  };
  expect_same(step(MPI_COMM_WORLD, 1, false, true), "DP " + std::to_string(n) + " + ZeRO-1");
  if (n > 1) expect_same(step(MPI_COMM_WORLD, n, false, false), "TP " + std::to_string(n));
  if (n == 4) {
    expect_same(step(MPI_COMM_WORLD, 2, true, true), "TP 2 x DP 2 + SP + ZeRO-1");
    MPI_Comm half = MPI_COMM_NULL;  // two jobs of TP 2 side by side, each the whole batch
    MPI_Comm_split(MPI_COMM_WORLD, world.rank() / 2, world.rank(), &half);
    expect_same(step(half, 2, false, false), "TP 2");
    MPI_Comm_free(&half);
  }
}

// PPO's critic split over the tensor group (TP = np, and TP 2 x DP 2 at np 4; with and
// without sequence parallelism; key/value heads replicated at TP 4 over 2 heads) against
// the whole critic: the same values, GAE returns, value-loss metrics, gradient norm and,
// after two updates (the clip acts on the second), every shard's weights equal the whole
// critic's slices; its checkpoint group loads back into the whole critic.
class TensorParallelCritic : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(TensorParallelCritic, EqualsTheWholeCritic) {
  MpiComm world(MPI_COMM_WORLD, "trainer");
  const int n = world.size();
  const auto [tp_param, sequence_parallel] = GetParam();
  const int tp = tp_param == 0 ? n : tp_param;
  if (n % tp != 0 || (tp == 1 && n > 1) || (sequence_parallel && tp == 1)) GTEST_SKIP() << "TP " << tp << " at np " << n;
  const ModelConfig cfg = tp_config(tp, /*tied=*/false, /*moe=*/false, /*kv_heads=*/2);
  ModelParallel mp(MPI_COMM_WORLD, tp, 1, DeviceChoice{}, sequence_parallel, kv_head_replicas(cfg, tp));
  const int d = mp.data_index();
  TrainerConfig tc;
  tc.mode = "rl";
  tc.estimator = &advantage_estimators().get("ppo");
  tc.gamma = 0.9;
  tc.lambd = 0.8;
  tc.n_micro_batches = 2;
  tc.grad_bucket_bytes = 1 << 12;
  tc.critic.lr.lr = 1e-2;
  tc.critic.clip_grad = 0.05;
  tc.critic.value_clip = 0.01;
  tc.critic.seed = 5;
  tc.adam.eps = 1e-3;  // keeps the comparison about the gradients (see rl_config)

  Transformer whole(cfg, 1, at::kCPU);
  Trainer base(tc, whole, &mp.data());
  std::vector<Sample> want = samples_of(d);
  auto want_rollout = base.prepare_rollout(want, /*recompute_old=*/false);
  auto want_1 = base.critic()->train_step(want), want_2 = base.critic()->train_step(want);

  Transformer shard(cfg, 1, at::kCPU, at::kFloat, {}, mp.tensor_shard());
  Trainer split(tc, shard, &mp.data());
  std::vector<Sample> got = samples_of(d);
  auto got_rollout = split.prepare_rollout(got, /*recompute_old=*/false);
  for (size_t j = 0; j < got.size(); ++j)
    for (size_t i = 0; i < got[j].values.size(); ++i) {
      EXPECT_NEAR(got[j].values[i], want[j].values[i], 2e-5) << "sample " << j << " token " << i;
      EXPECT_NEAR(got[j].returns[i], want[j].returns[i], 2e-5) << "sample " << j << " token " << i;
    }
  for (const auto& [k, x] : want_rollout) EXPECT_NEAR(got_rollout.at(k), x, 1e-4 * std::max(1.0, std::abs(x))) << k;
  auto got_1 = split.critic()->train_step(got), got_2 = split.critic()->train_step(got);
  for (const auto& [w, g] : {std::pair{&want_1, &got_1}, std::pair{&want_2, &got_2}})
    for (const auto& [k, x] : *w) EXPECT_NEAR(g->at(k), x, 1e-4 * std::max(1.0, std::abs(x))) << k;
  EXPECT_GT(want_1.at("train/critic_grad_norm"), 0.05);  // the clip acted
  EXPECT_GT(want_2.at("train/value_clipfrac"), 0.0);
  const StoredWhole stored{&cfg, mp.tensor_shard()};
  const auto whole_critic = by_name(base.critic()->parameters(), false);
  for (const auto& p : split.critic()->parameters())
    expect_close(p.tensor.detach(), stored.part_of(p.name, whole_critic.at(p.name)), "critic " + p.name);

  // Its checkpoint group holds whole tensors: the whole critic reads them back.
  const testing::SharedTmpDir scratch;  // its own: np variants and reruns may run at once
  const std::string path = scratch.file("critic.h5");
  split.save(path, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  Transformer reread(cfg, 9, at::kCPU);
  Trainer again(tc, reread, nullptr);
  again.load(path);
  for (const auto& p : again.critic()->parameters())
    expect_close(p.tensor.detach(), whole_critic.at(p.name), "reloaded critic " + p.name);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world.rank() == 0) std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelCritic,
                         ::testing::Values(std::tuple{0, false}, std::tuple{2, false}, std::tuple{0, true}));

TEST(TensorShard, SplitsAndPadsAsMegatron) {
  ModelConfig cfg = tp_config(2, false, false);
  EXPECT_EQ(padded_vocab_size(260, 1), 260);
  EXPECT_EQ(padded_vocab_size(260, 2), 512);
  EXPECT_EQ(padded_vocab_size(151936, 1), 151936);  // Qwen3's (a multiple of 128)
  EXPECT_EQ(padded_vocab_size(151936, 4), 152064);  // the next multiple of 512
  EXPECT_EQ(parameter_split("model.layers.0.self_attn.q_proj.weight", cfg, 2).dim, 0);
  EXPECT_EQ(parameter_split("exp_avg/model.layers.1.self_attn.o_proj.weight", cfg, 2).dim, 1);
  EXPECT_EQ(parameter_split("model.layers.0.mlp.down_proj.weight", cfg, 2).dim, 1);
  EXPECT_FALSE(parameter_split("model.layers.0.mlp.experts.3.gate_proj.weight", cfg, 2).split());
  // Shared experts split as the dense MLP: Qwen2-MoE's (its gate whole) and DeepSeekMoE's.
  ModelConfig moe = tp_config(2, false, true);
  EXPECT_EQ(parameter_split("model.layers.1.mlp.shared_expert.up_proj.weight", moe, 2).dim, 0);
  EXPECT_EQ(parameter_split("model.layers.1.mlp.shared_expert.down_proj.weight", moe, 2).dim, 1);
  EXPECT_FALSE(parameter_split("model.layers.1.mlp.shared_expert_gate.weight", moe, 2).split());
  moe = tp_config(2, false, true, 0, 0, /*deepseek=*/true);
  const ParameterSplit shared_gate = parameter_split("model.layers.1.mlp.shared_experts.gate_proj.weight", moe, 2);
  EXPECT_EQ(shared_gate.dim, 0);
  EXPECT_EQ(shared_gate.whole, moe.n_shared_experts * moe.moe_intermediate_size);
  EXPECT_EQ(parameter_split("model.layers.1.mlp.shared_experts.down_proj.weight", moe, 2).dim, 1);
  EXPECT_FALSE(parameter_split("model.layers.1.mlp.gate.e_score_correction_bias", moe, 2).split());
  EXPECT_FALSE(parameter_split("model.layers.0.self_attn.q_norm.weight", cfg, 2).split());
  EXPECT_FALSE(parameter_split("model.layers.0.self_attn.q_proj.weight", cfg, 1).split());
  const ParameterSplit vocab = parameter_split("lm_head.weight", cfg, 2);
  EXPECT_EQ(vocab.whole, 260);
  EXPECT_EQ(vocab.padded, 512);
  // Gate and up each split on their own: shard r holds rows [r·F/t, (r+1)·F/t) of both.
  const at::Tensor gate = at::arange(64 * 4, at::kFloat).view({64, 4});
  const ParameterSplit g = parameter_split("model.layers.0.mlp.gate_proj.weight", cfg, 2);
  EXPECT_TRUE(at::equal(shard_of_whole(gate, g, {1, 2, nullptr}), gate.narrow(0, 32, 32)));
  // Fewer key/value heads than ranks: each is held by t / Hkv consecutive ranks.
  cfg.n_kv_heads = 2;
  EXPECT_NO_THROW(check_tensor_parallel_shape(cfg, 4));
  EXPECT_EQ(kv_head_replicas(cfg, 4), 2);
  EXPECT_EQ(local_kv_heads(cfg, 4), 1);
  EXPECT_EQ(kv_head_replicas(cfg, 2), 1);
  const ParameterSplit kv = parameter_split("model.layers.0.self_attn.k_proj.weight", cfg, 4);
  EXPECT_EQ(kv.replicas, 2);
  const at::Tensor k = at::arange(16 * 4, at::kFloat).view({16, 4});  // 2 heads of 8 rows
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(at::equal(shard_of_whole(k, kv, {r, 4, nullptr}), k.narrow(0, 8 * (r / 2), 8))) << r;
  const at::Tensor stacked = at::stack({k.narrow(0, 0, 8), k.narrow(0, 0, 8), k.narrow(0, 8, 8), k.narrow(0, 8, 8)});
  EXPECT_TRUE(at::equal(whole_of_shards(stacked, kv), k));
  EXPECT_FALSE(parameter_split("model.layers.0.self_attn.q_proj.weight", cfg, 4).replicas > 1);
  cfg.n_kv_heads = 4;
  cfg.n_heads = 12;
  EXPECT_THROW(check_tensor_parallel_shape(cfg, 6), Error);  // 4 neither divides 6 nor is divisible by it
}

// A hybrid model's Gated DeltaNet layers split by key heads: the q/k/v channels (grouped by
// key head in slimpi, model/linear_channels.h) in one contiguous run per rank, the value
// heads' tensors by rows, out_proj by columns, the gated norm whole.
TEST(TensorShard, GatedDeltaNetLayersSplitByKeyHeads) {
  ModelConfig cfg = tp_config(4, false, false, 0, 0, false, false, /*hybrid=*/true);
  const std::string a = "model.layers.0.linear_attn.";
  const int64_t C = cfg.linear_conv_dim(), vd = cfg.linear_value_dim(), hv = cfg.linear_num_value_heads;
  for (const auto& [name, dim, whole] :
       {std::tuple{"in_proj_qkv.weight", 0, C}, {"conv1d.weight", 0, C}, {"in_proj_z.weight", 0, vd},
        {"in_proj_b.weight", 0, hv}, {"in_proj_a.weight", 0, hv}, {"dt_bias", 0, hv}, {"A_log", 0, hv},
        {"out_proj.weight", 1, vd}}) {
    const ParameterSplit split = parameter_split(a + name, cfg, 4);
    EXPECT_EQ(split.dim, dim) << name;
    EXPECT_EQ(split.whole, whole) << name;
  }
  EXPECT_FALSE(parameter_split(a + "norm.weight", cfg, 4).split());
  EXPECT_EQ(local_linear_heads(cfg, 4).key_heads, 1);
  EXPECT_EQ(local_linear_heads(cfg, 4).value_heads, 2);
  EXPECT_EQ(local_linear_heads(cfg, 2).conv_dim, C / 2);
  // Rank r's channels are key head r's query, key and its value heads' values.
  const at::Tensor hf_rows = at::arange(C, at::kFloat);  // Hugging Face's order: all q, all k, all v
  const at::Tensor held = linear_channels_from_hf(hf_rows, cfg);
  EXPECT_TRUE(at::equal(linear_channels_to_hf(held, cfg), hf_rows));
  const int64_t Dk = cfg.linear_key_head_dim, Dv = cfg.linear_value_head_dim, Hk = cfg.linear_num_key_heads;
  const ParameterSplit qkv = parameter_split(a + "in_proj_qkv.weight", cfg, 4);
  for (int r = 0; r < 4; ++r) {
    const at::Tensor want = at::cat({at::arange(r * Dk, (r + 1) * Dk), at::arange(Hk * Dk + r * Dk, Hk * Dk + (r + 1) * Dk),
                                     at::arange(2 * Hk * Dk + r * 2 * Dv, 2 * Hk * Dk + (r + 1) * 2 * Dv)})
                             .to(at::kFloat);
    EXPECT_TRUE(at::equal(shard_of_whole(held, qkv, {r, 4, nullptr}), want)) << "rank " << r;
  }
  // Qwen3-Next's fused projections are grouped by key head in its files already.
  cfg.linear_fused_projections = true;
  EXPECT_FALSE(holds_linear_channels(a + "in_proj_qkvz.weight", cfg));
  EXPECT_TRUE(holds_linear_channels(a + "conv1d.weight", cfg));
  EXPECT_EQ(parameter_split(a + "in_proj_qkvz.weight", cfg, 4).whole, C + vd);
  EXPECT_EQ(parameter_split(a + "in_proj_ba.weight", cfg, 4).whole, 2 * hv);
  cfg.linear_num_key_heads = 2;
  cfg.linear_num_value_heads = 4;
  EXPECT_NO_THROW(check_tensor_parallel_shape(cfg, 2));
  EXPECT_THROW(check_tensor_parallel_shape(cfg, 4), Error);  // 2 key heads over 4 ranks
}

// A run of a shard's elements, read through its span's blocks out of the whole tensor,
// is the run of shard_of_whole's part (per-rank checkpoint I/O relies on it); the
// padded vocabulary rows are the unstored tail.
TEST(TensorShard, SpansPlaceEveryRunOfAShardInTheWholeTensor) {
  const ModelConfig cfg = tp_config(4, false, false, /*kv_heads=*/2);  // k/v replicated at t = 4
  const int64_t d = cfg.hidden_size, q = cfg.n_heads * cfg.head_dim();
  const std::vector<std::pair<std::string, std::vector<int64_t>>> tensors{
      {"lm_head.weight", {cfg.vocab_size, d}},                           // rows, padded
      {"exp_avg/model.layers.0.self_attn.o_proj.weight", {d, q}},        // columns
      {"model.layers.0.self_attn.q_proj.bias", {q}},                     // rows of a vector
      {"model.layers.1.self_attn.k_proj.weight", {2 * cfg.head_dim(), d}},  // rows, replicated at t = 4
      {"model.layers.1.input_layernorm.weight", {d}},                    // replicated
      {"model.layers.0.mlp.down_proj.weight", {d, cfg.intermediate_size}}};
  at::Generator gen = at::detail::createCPUGenerator(5);
  for (int t : {1, 2, 4})
    for (const auto& [name, shape] : tensors) {
      const at::Tensor whole = at::randn(shape, gen, at::kDouble);
      const ParameterSplit split = parameter_split(name, cfg, t);
      for (int r = 0; r < t; ++r) {
        const StoredWhole stored{&cfg, {r, t, nullptr}};
        const at::Tensor part = shard_of_whole(whole, split, stored.shard).reshape({-1});
        const std::vector<int64_t> local = shard_of_whole(whole, split, stored.shard).sizes().vec();
        for (auto [begin, count] : std::vector<std::pair<int64_t, int64_t>>{
                 {0, part.numel()}, {3, 1}, {1, part.numel() - 2}, {part.numel() / 3, part.numel() / 2}, {5, 0}}) {
          const StoredWhole::Span span = stored.span_of(name, local, begin, count);
          EXPECT_EQ(span.whole, shape) << name;
          const at::Tensor rows_cols = whole.dim() == 1 ? whole.view({-1, 1}) : whole;
          std::vector<at::Tensor> read{at::empty({0}, at::kDouble)};
          for (const auto& b : span.blocks)
            read.push_back(rows_cols.narrow(0, b.row, b.rows).narrow(1, b.col, b.cols).reshape({-1}));
          const at::Tensor got = at::cat(read);
          ASSERT_EQ(got.numel(), span.stored) << name << " t " << t << " r " << r;
          EXPECT_TRUE(at::equal(got, part.narrow(0, begin, span.stored))) << name << " t " << t << " r " << r;
          const at::Tensor tail = part.narrow(0, begin + span.stored, count - span.stored);
          EXPECT_TRUE(tail.numel() == 0 || (split.padded > split.whole && at::equal(tail, at::zeros_like(tail))))
              << name << ": only padding goes unstored";
          EXPECT_LE(span.blocks.size(), 3u);
        }
      }
    }
}

}  // namespace
}  // namespace slimpi
