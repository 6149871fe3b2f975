// Expert parallelism at np 2 and 4 (parallel.expert_parallel = 2 and = np): a trainer
// whose policy holds one block of the experts gives the loss, metrics, log-probs,
// gradients and updated weights of the same data-parallel trainer with every expert on
// every rank (to fp32 round-off), also when the ranks run different numbers of
// micro-batches (a rank with none included); its checkpoint is the whole model's, and
// loads back into a shard; gathering the shards gives the whole model. Also with routing
// replay and its unreplayed-gap forward, in bf16 with every token replayed onto two
// experts (ranks holding others receive nothing), and for a DeepSeekMoE model whose
// trained MTP depth is an MoE layer (its exchanges met by a rank with no micro-batch).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>

#include "shared_tmp.h"
#include "io/h5.h"
#include "io/tensor_io.h"
#include "parallel/comm_tensor.h"
#include "parallel/device.h"
#include "parallel/mpi_comm.h"
#include "train/expert_parallel.h"
#include "sync/whole_model.h"
#include "train/trainer.h"
#include "../support/tensor_checks.h"
#include "../support/tiny_model.h"

namespace slimpi {
namespace {

using testing::by_name;
using testing::expect_close;

// How a case runs: fp32; fp32 replaying random traces (with the unreplayed-gap forward);
// bf16 replaying traces that name experts 0 and 1 only, so that the ranks holding the
// others receive no rows at all; a DeepSeekMoE model (sigmoid router, 2 groups, a shared
// expert) whose trained MTP depth is an MoE layer, so that a rank out of micro-batches
// meets the depth's exchanges too.
enum class Variant { FP32, Replay, Bf16OnlyTwoExperts, DeepSeekMtp };

ModelConfig moe_config(Variant v = Variant::FP32) {
  ModelConfig c = testing::tiny_model_config(/*max_seq_len=*/32, /*init_std=*/0.1);
  c.n_experts = 8;
  c.n_experts_per_tok = 2;
  c.moe_intermediate_size = 24;
  c.shared_expert_intermediate_size = 16;
  if (v == Variant::DeepSeekMtp) {
    c.shared_expert_intermediate_size = 0;
    testing::use_deepseek_moe(c, /*n_group=*/2, /*topk_group=*/1, /*first_k_dense=*/0);
    c.mtp_num_layers = 1;
  }
  return c;
}

TrainerConfig config(int64_t micro, Variant v = Variant::FP32) {
  TrainerConfig c;
  c.mtp_loss_coef = v == Variant::DeepSeekMtp ? 0.3 : 0.0;
  c.routing_replay = c.routing_replay_gap = v == Variant::Replay || v == Variant::Bf16OnlyTwoExperts;
  if (v == Variant::Bf16OnlyTwoExperts) c.precision = Precision::BF16;
  c.mode = "rl";
  c.use_kl_loss = true;
  c.kl_loss_coef = 0.1;
  c.kl_loss_type = "low_var_kl";
  c.entropy_coef = 0.01;
  c.normalize_advantages = true;
  c.moe_aux_loss_coef = 0.01;
  c.moe_z_loss_coef = 0.001;
  c.n_micro_batches = micro;
  c.clip_grad = 0.5;  // acts: the norm of the whole model's gradient must be the same
  c.lr.lr = 1e-2;
  // Adam's first step is lr · g / (|g| + eps): with a tiny eps, round-off in a near-zero
  // gradient element moves its weight by up to lr. A larger eps keeps the comparison
  // about the gradients.
  c.adam.eps = 1e-3;
  c.grad_bucket_bytes = 1 << 12;
  return c;
}

// Rank r's samples: r + 1 of them (np 4 with the last rank emptied: 1, 2, 3, 0), so
// that ranks run different numbers of micro-batches.
std::vector<Sample> samples_of(int r, int n, Variant v = Variant::FP32) {
  at::Generator g = at::detail::createCPUGenerator(100 + r);
  std::vector<Sample> out;
  const int count = (n == 4 && r == 3) ? 0 : r + 1;
  for (int i = 0; i < count; ++i) {
    Sample s;
    const int64_t len = 6 + at::randint(12, {1}, g, at::kLong).item<int64_t>();
    at::Tensor t = at::randint(40, {len}, g, at::kLong);
    s.tokens.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + len);
    s.prompt_length = 2 + i % 3;
    s.reward = at::randn({1}, g).item<float>();
    const bool replayed = v == Variant::Replay || v == Variant::Bf16OnlyTwoExperts;
    if (replayed) s.rollout_log_probs.assign(size_t(s.response_length()), -3.0f);
    for (int64_t tok = 0; replayed && tok + 1 < len; ++tok)  // [tokens - 1, 2 layers, top-2]
      for (int64_t l = 0; l < 2; ++l) {
        const int16_t a = v == Variant::Replay ? int16_t((tok * 3 + l + i) % 8) : 0;
        s.routing.insert(s.routing.end(), {a, int16_t(v == Variant::Replay ? (a + 1 + tok % 7) % 8 : 1)});
      }
    out.push_back(s);
  }
  return out;
}

class ExpertParallel : public ::testing::TestWithParam<std::tuple<int, Variant>> {};

TEST_P(ExpertParallel, SameStepAsEveryExpertOnEveryRank) {
  MpiComm world(MPI_COMM_WORLD, "trainer");
  const int r = world.rank(), n = world.size();
  const int ep = std::get<0>(GetParam()) == 0 ? n : std::get<0>(GetParam());
  const Variant v = std::get<1>(GetParam());
  if (n < 2 || n % ep != 0) GTEST_SKIP() << "expert parallelism of " << ep << " at np " << n;
  // bf16: the two sides group the expert GEMMs' rows differently, so they round apart.
  const double rtol = v == Variant::Bf16OnlyTwoExperts ? 3e-2 : 1e-4, atol = v == Variant::Bf16OnlyTwoExperts ? 1e-3 : 1e-6;
  for (int64_t micro : {1, 2}) {
    SCOPED_TRACE("micro-batches " + std::to_string(micro));
    // Every expert on every rank: the data-parallel baseline.
    Transformer whole(moe_config(v), 1, at::kCPU), whole_ref(moe_config(v), 2, at::kCPU);
    Trainer base(config(micro, v), whole, &world, &whole_ref);
    std::vector<Sample> want = samples_of(r, n, v);
    auto want_rollout = base.prepare_rollout(want, /*recompute_old=*/true);
    auto want_step = base.train_step(want);
    const auto want_grads = by_name(whole.parameters(), true);
    const auto want_weights = by_name(whole.parameters(), false);

    ExpertGroups groups(MPI_COMM_WORLD, ep, DeviceChoice{});
    Transformer shard(moe_config(v), 1, at::kCPU, at::kFloat, groups.shard());
    Transformer shard_ref(moe_config(v), 2, at::kCPU, at::kFloat, groups.shard());
    ASSERT_LT(shard.n_params(), whole.n_params());
    MpiComm dp(MPI_COMM_WORLD, "trainer");
    Trainer sharded(config(micro, v), shard, &dp, &shard_ref, &groups.replicas());
    std::vector<Sample> got = samples_of(r, n, v);
    auto got_rollout = sharded.prepare_rollout(got, /*recompute_old=*/true);
    for (size_t j = 0; j < got.size(); ++j)
      for (size_t t = 0; t < got[j].old_log_probs.size(); ++t) {
        EXPECT_NEAR(got[j].old_log_probs[t], want[j].old_log_probs[t], 10 * atol + 1e-5);
        EXPECT_NEAR(got[j].ref_log_probs[t], want[j].ref_log_probs[t], 10 * atol + 1e-5);
      }
    const double mtol = v == Variant::Bf16OnlyTwoExperts ? 1e-2 : 1e-5;
    for (const auto& [k, x] : want_rollout) EXPECT_NEAR(got_rollout.at(k), x, mtol * std::max(1.0, std::abs(x))) << k;
    auto got_step = sharded.train_step(got);
    for (const auto& [k, x] : want_step) {
      if (k.rfind("perf/", 0) == 0) continue;
      EXPECT_NEAR(got_step.at(k), x, mtol * std::max(1.0, std::abs(x))) << k;
    }
    if (v == Variant::Replay || v == Variant::Bf16OnlyTwoExperts)  // replay acted (the traces are not the routers' choices)
      EXPECT_NE(want_rollout.at("train/train_rollout_logprob_abs_diff_unreplayed"),
                want_step.at("train/train_rollout_logprob_abs_diff"));
    EXPECT_GT(want_step.at("train/grad_norm"), 0.5);  // the clip acted
    if (v == Variant::DeepSeekMtp) EXPECT_GT(want_step.at("train/mtp_loss"), 0.0);  // the depth trained
    ASSERT_NE(sharded.expert_grads(), nullptr);
    for (const auto& p : shard.parameters()) {
      expect_close(p.tensor.grad(), want_grads.at(p.name), "gradient of " + p.name, rtol, atol);
      expect_close(p.tensor.detach(), want_weights.at(p.name), "updated " + p.name, rtol, atol);
    }
    if (v != Variant::FP32) continue;

    // The checkpoint holds the whole model and optimizer, as the baseline's does.
    const testing::SharedTmpDir scratch;  // its own: np variants and reruns may run at once
    const std::string& dir = scratch.path();
    world.barrier();
    const std::string base_path = dir + "/base.h5", shard_path = dir + "/sharded.h5";
    if (r == 0) base.save(base_path);
    sharded.save(shard_path, MPI_COMM_WORLD);  // every rank: the first holder of each part writes it
    world.barrier();
    if (r == 0) {
      h5::File a = h5::File::open(base_path, false, MPI_COMM_NULL), b = h5::File::open(shard_path, false, MPI_COMM_NULL);
      h5::Handle ma = h5::open_group(a.id(), "model"), mb = h5::open_group(b.id(), "model");
      h5::Handle oa = h5::open_group(a.id(), "optimizer"), ob = h5::open_group(b.id(), "optimizer");
      for (const auto& p : whole.parameters()) {
        expect_close(read_tensor(mb.id(), p.name), read_tensor(ma.id(), p.name), "stored " + p.name);
        for (const std::string moment : {"exp_avg/", "exp_avg_sq/"})
          expect_close(read_tensor(ob.id(), moment + p.name), read_tensor(oa.id(), moment + p.name),
                       "stored " + moment + p.name, 1e-3, 1e-9);
      }
    }
    // Loading the baseline's whole checkpoint into a fresh shard picks its experts.
    Transformer fresh(moe_config(), 7, at::kCPU, at::kFloat, groups.shard());
    TrainerConfig no_kl = config(micro);
    no_kl.use_kl_loss = false;
    Trainer reloaded(no_kl, fresh, &dp, nullptr, &groups.replicas());
    reloaded.load(base_path);
    for (const auto& p : fresh.parameters())
      EXPECT_TRUE(at::equal(p.tensor, want_weights.at(p.name))) << "loaded " << p.name;
    EXPECT_EQ(reloaded.n_steps(), 1);
    // Gathering the shards gives the whole model (into a bf16 copy: rounded once).
    Transformer gathered(moe_config(), 9, at::kCPU, at::kBFloat16);
    gather_whole_model(fresh, &gathered);
    for (const auto& p : gathered.parameters())
      EXPECT_TRUE(at::equal(p.tensor, want_weights.at(p.name).to(at::kBFloat16))) << "gathered " << p.name;
    world.barrier();
  }
}

INSTANTIATE_TEST_SUITE_P(GroupSizes, ExpertParallel,
                         ::testing::Combine(::testing::Values(2, 0),  // 0: every rank one group
                                            ::testing::Values(Variant::FP32, Variant::Replay,
                                                              Variant::Bf16OnlyTwoExperts, Variant::DeepSeekMtp)));

TEST(ExpertParallel, ShiftsExpertIndicesInNames) {
  EXPECT_EQ(shift_expert_index("model.layers.3.mlp.experts.5.up_proj.weight", 4),
            "model.layers.3.mlp.experts.9.up_proj.weight");
  EXPECT_EQ(shift_expert_index("exp_avg/model.layers.0.mlp.experts.12.down_proj.weight", -12),
            "exp_avg/model.layers.0.mlp.experts.0.down_proj.weight");
  EXPECT_EQ(shift_expert_index("model.layers.0.mlp.gate.weight", 3), "model.layers.0.mlp.gate.weight");
}

}  // namespace
}  // namespace slimpi
