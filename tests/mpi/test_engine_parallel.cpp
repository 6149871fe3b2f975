// Tensor-parallel rollout engines and the sliced weight sync, at np 2, 4 and 6, each
// against one rank:
// - an engine whose model is split over a group of 2 or 4 ranks (rollout/engine_group.h:
//   the leader schedules and samples, the followers run its announced forwards) returns
//   the samples of a one-rank engine over the whole model: the same tokens, log-probs
//   and routing traces to fp32 round-off, with prefix sharing, forked groups whose
//   prompt ends in a partial block (the copy the followers make), chunked prefill,
//   preemption and recomputation in a small KV cache, grouped-query attention with q/k
//   norms and a mixture-of-experts layer; in bf16 (where each rank's partial sums are
//   rounded before the group adds them, so draws may part) the sampled tokens'
//   log-probs are the whole bf16 model's to that rounding;
// - the sliced weight sync (sync/weight_sync_plan.h) from a trainer layout (TP t x
//   EP G) to engines of TP e leaves on every engine rank exactly its slice of the whole
//   tensors (the trainer's values, in the engines' dtype): TP 2 -> engines of TP 1, 2
//   and 4, TP 1 -> TP 2, TP 2 x EP 2 (experts at two data-parallel indices) -> TP 2;
//   each engine rank receives exactly the elements it holds, and the checksums of
//   every (sender, receiver) pair agree.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>

#include "kernels/counter_rng.h"
#include "model/precision.h"
#include "model/tensor_shard.h"
#include "model/transformer.h"
#include "parallel/comm_tensor.h"
#include "parallel/mpi_comm.h"
#include "rollout/engine.h"
#include "rollout/engine_group.h"
#include "sync/weight_sync_plan.h"
#include "tokenizer/byte_tokenizer.h"
#include "../support/tiny_model.h"
#include "../support/mpi_world.h"

namespace slimpi {
namespace {

using testing::world_rank;
using testing::world_size;

// 8 query heads over 4 key/value heads (or `kv_heads`: replicated over a larger group):
// splits over 1, 2 or 4 ranks.
// mla: DeepSeek-V3's shape (multi-head latent attention, cached as its latent; DeepSeekMoE).
// hybrid: Qwen3.5's (layers 0-2 Gated DeltaNet, 4 key heads shared by 8 value heads; layer
// 3 gated full attention): no prefix cache (rollout/engine.h).
constexpr double kHybridLogpBar = 3e-4;

ModelConfig engine_model_config(bool moe, int kv_heads = 4, int mtp = 0, bool mla = false, bool hybrid = false,
                                bool fused = false) {
  ModelConfig c = testing::tiny_model_config(96, 0.3);
  c.mtp_num_layers = mtp;
  c.n_heads = 8;
  c.n_kv_heads = kv_heads;
  c.hidden_size = 64;
  c.qk_norm = true;
  if (moe) {
    c.n_experts = 4;
    c.n_experts_per_tok = 2;
    c.moe_intermediate_size = 32;
    c.moe_layer_freq = 2;  // layer 1 is sparse
  }
  if (mla) {
    testing::use_latent_attention(c);
    c.q_lora_rank = 24;
    if (moe) testing::use_deepseek_moe(c, /*n_group=*/1, /*topk_group=*/1, /*first_k_dense=*/0);
  }
  if (hybrid) {
    testing::use_gated_delta_net(c);
    c.linear_num_key_heads = 4;
    c.linear_num_value_heads = 8;
    c.linear_fused_projections = fused;  // (Qwen3-Next's in_proj_qkvz, in_proj_ba)
    // The gated norm multiplies fp32 round-off by up to 1/sqrt(eps) where a random model's
    // linear-layer output nearly cancels (tests/unit/rollout/test_engine_hybrid.cpp): at
    // 1e-4 (Qwen3.5's is 1e-6) that bound is 1e2 and two evaluations' log-probs meet within
    // kHybridLogpBar.
    c.rms_norm_eps = 1e-4;
  }
  return c;
}

std::vector<GenerationRequest> requests(int n_groups) {
  std::vector<GenerationRequest> out;
  for (int g = 0; g < n_groups; ++g) {
    GenerationRequest r;
    r.group_index = g;
    r.prompt = {ByteTokenizer::kBos};
    for (int i = 0; i < 8; ++i) r.prompt.push_back(40 + i);  // a shared header: prefix-cache hits
    // Group 0's 22 tokens fill the first step's 16-token prefill budget without finishing
    // their prompt: a forward that needs no logits row.
    for (int i = 0; i < 3 + ((g + 2) * 5) % 11; ++i) r.prompt.push_back((g * 31 + i * 7) % 256);
    r.n_samples = 3;
    r.params.temperature = 1.0;
    r.params.max_new_tokens = 24;
    r.params.stop_token_ids = {ByteTokenizer::kEos};
    r.seed = mix_seed(77, 0, uint64_t(g));
    out.push_back(r);
  }
  return out;
}

EngineConfig small_engine() {
  EngineConfig cfg;
  cfg.block_size = 4;           // prompts end inside a block: forks copy it
  cfg.kv_cache_tokens = 4 * 40;  // tight: sequences are preempted and recomputed
  cfg.max_running = 9;
  cfg.max_batch_tokens = 48;
  cfg.chunked_prefill_tokens = 16;
  return cfg;
}

void expect_same_samples(const std::vector<Sample>& got, const std::vector<Sample>& want, double logp_tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const std::string what = "group " + std::to_string(want[i].group_index) + " sample " + std::to_string(want[i].index);
    ASSERT_EQ(got[i].tokens, want[i].tokens) << what;
    ASSERT_EQ(got[i].rollout_log_probs.size(), want[i].rollout_log_probs.size()) << what;
    for (size_t k = 0; k < got[i].rollout_log_probs.size(); ++k)
      EXPECT_NEAR(got[i].rollout_log_probs[k], want[i].rollout_log_probs[k], logp_tol) << what << " token " << k;
    EXPECT_EQ(got[i].routing, want[i].routing) << what;
    EXPECT_EQ(got[i].status, want[i].status) << what;
  }
}

// Engines of e ranks over the world's first ranks (groups of e consecutive ranks, each
// running the same requests): every leader's samples equal a one-rank engine's.
void expect_engines_match_one_rank(int e, bool moe, at::ScalarType dtype, int kv_heads = 4, bool mla = false,
                                   bool hybrid = false, bool fused = false) {
  const int n = world_size(), rank = world_rank();
  if (n % e != 0) GTEST_SKIP() << "np " << n << " does not split into engines of " << e;
  MPI_Comm group_mpi;
  MPI_Comm_split(MPI_COMM_WORLD, rank / e, rank, &group_mpi);
  MpiComm group(group_mpi, "engine_group");
  const ModelConfig cfg = engine_model_config(moe, kv_heads, 0, mla, hybrid, fused);
  const TensorShard shard{group.rank(), e, &group, false};
  Transformer model(cfg, 5, at::kCPU, dtype, {}, shard);
  const std::vector<GenerationRequest> reqs = requests(6);
  EngineConfig engine_cfg = small_engine();
  engine_cfg.prefix_cache = !hybrid;
  if (group.rank() == 0) {
    Engine engine(engine_cfg, model, group_mpi);
    for (const auto& r : reqs) engine.add_request(r);
    const std::vector<Sample> got = engine.run_to_completion();
    engine.release_group();
    EXPECT_GT(engine.stats().preemptions, 0) << "the cache should be tight enough to preempt";
    if (!hybrid) EXPECT_GT(engine.stats().prefix_hit_tokens, 0);
    Transformer whole(cfg, 5, at::kCPU, dtype);
    if (dtype == at::kFloat) {
      Engine reference(engine_cfg, whole);
      for (const auto& r : reqs) reference.add_request(r);
      expect_same_samples(got, reference.run_to_completion(), hybrid ? kHybridLogpBar : 1e-4);
    } else {
      // bf16: each rank's row-parallel partial product is rounded to bf16 before the
      // group sums them, where one rank rounds the whole product once, so the draws may
      // part. The mean gap between a sampled token's log-prob and the whole bf16 model's
      // (forward_packed) is a one-rank bf16 engine's (~2e-5 here: the same ops) plus
      // that rounding (~0.02 at this init scale); a wrong shard or KV slot gives ~1.
      auto mean_gap = [&](const std::vector<Sample>& samples) {
        at::NoGradGuard no_grad;
        ForwardPrecision scope(Precision::BF16, at::kCPU);
        double sum = 0;
        int64_t n = 0;
        for (const Sample& s : samples) {
          const at::Tensor logits = whole.forward_packed(at::tensor(s.tokens, at::kLong), {int64_t(s.tokens.size())});
          const at::Tensor logp = at::log_softmax(logits.to(at::kFloat), -1);  // [T, V]
          for (int64_t k = 0; k < s.response_length(); ++k, ++n) {
            const int64_t pos = s.prompt_length + k;
            sum += std::abs(s.rollout_log_probs[size_t(k)] - logp[pos - 1][s.tokens[size_t(pos)]].item<float>());
          }
        }
        return sum / double(std::max<int64_t>(n, 1));
      };
      Engine reference(engine_cfg, whole);
      for (const auto& r : reqs) reference.add_request(r);
      const double gap_group = mean_gap(got), gap_one = mean_gap(reference.run_to_completion());
      EXPECT_LT(gap_one, 1e-3);
      EXPECT_LT(gap_group, 0.04) << "one rank: " << gap_one;
    }
  } else {
    EngineFollower(engine_cfg, model, group_mpi).follow();
  }
  MPI_Comm_free(&group_mpi);
}

TEST(TensorParallelEngine, TwoRanksGenerateWhatOneRankDoes) { expect_engines_match_one_rank(2, false, at::kFloat); }
TEST(TensorParallelEngine, FourRanksGenerateWhatOneRankDoes) { expect_engines_match_one_rank(4, false, at::kFloat); }
TEST(TensorParallelEngine, AMixtureOfExpertsModelKeepsItsRoutingTraces) {
  expect_engines_match_one_rank(2, true, at::kFloat);
}
TEST(TensorParallelEngine, Bf16) { expect_engines_match_one_rank(2, false, at::kBFloat16); }
// Multi-head latent attention: each rank attends with its heads over the whole latent it
// caches (DeepSeekMoE layers whole on every rank).
TEST(TensorParallelEngine, LatentAttentionTwoRanks) { expect_engines_match_one_rank(2, true, at::kFloat, 4, true); }
TEST(TensorParallelEngine, LatentAttentionFourRanks) { expect_engines_match_one_rank(4, true, at::kFloat, 4, true); }
// Two key/value heads over four ranks: each rank caches the one its query heads use.
// Qwen3.5's hybrid layers: each rank's key heads' conv and recurrent states in its state slots.
TEST(TensorParallelEngine, HybridLinearAttentionTwoRanks) {
  expect_engines_match_one_rank(2, false, at::kFloat, 4, false, true);
}
TEST(TensorParallelEngine, HybridLinearAttentionFourRanksWithExperts) {
  expect_engines_match_one_rank(4, true, at::kFloat, 4, false, true);
}
TEST(TensorParallelEngine, HybridFusedProjectionsTwoRanks) {  // Qwen3-Next's in_proj_qkvz / in_proj_ba
  expect_engines_match_one_rank(2, true, at::kFloat, 4, false, true, /*fused=*/true);
}
TEST(TensorParallelEngine, ReplicatedKeyValueHeads) { expect_engines_match_one_rank(4, false, at::kFloat, 2); }

// The world's first layout.n_members() ranks as the sliced sync's communicator
// (MPI_COMM_NULL on the others; collective over the world).
MPI_Comm sync_members(const SyncLayout& layout) {
  const int rank = world_rank();
  MPI_Comm sync_mpi;
  MPI_Comm_split(MPI_COMM_WORLD, rank < layout.n_members() ? 0 : MPI_UNDEFINED, rank, &sync_mpi);
  return sync_mpi;
}

// One sliced sync over the world's first layout.n_members() ranks: trainer members hold
// shards of the model drawn with seed 11, engines shards of seed 12 (in `wire`); after
// the sync every engine rank holds its slice of the seed-11 model in `wire`.
void expect_sliced_sync_delivers_slices(const SyncLayout& layout, bool moe, at::ScalarType wire, int kv_heads = 4,
                                        int mtp = 0, bool hybrid = false) {
  const int rank = world_rank();
  if (world_size() < layout.n_members()) GTEST_SKIP() << "needs " << layout.n_members() << " ranks";
  MPI_Comm sync_mpi = sync_members(layout);
  if (sync_mpi == MPI_COMM_NULL) return;
  MpiComm sync(sync_mpi, "sliced_sync");
  const ModelConfig cfg = engine_model_config(moe, kv_heads, mtp, false, hybrid);
  const bool trainer = rank < layout.n_trainer_members();
  const int t = layout.trainer_tensor, e = layout.engine_tensor;
  // Trainer members: tensor groups (same data index) and expert groups (same tensor rank).
  // Engines: groups of e. Comms the shards' constructors want; the sync uses only `sync`.
  const int color = trainer ? rank / t : 1000 + (rank - layout.n_trainer_members()) / e;
  MPI_Comm group_mpi, expert_mpi;
  MPI_Comm_split(sync_mpi, color, rank, &group_mpi);
  MPI_Comm_split(sync_mpi, trainer ? rank % t : 2000 + rank, rank, &expert_mpi);
  MpiComm group(group_mpi, "tensor"), experts(expert_mpi, "experts");
  std::unique_ptr<Transformer> mine;
  if (trainer) {
    const ExpertShard es = layout.trainer_expert > 1 ? ExpertShard{rank / t, layout.trainer_expert, &experts}
                                                     : ExpertShard{};
    mine = std::make_unique<Transformer>(cfg, 11, at::kCPU, at::kFloat, es,
                                         TensorShard{group.rank(), t, t > 1 ? &group : nullptr, false});
  } else {
    mine = std::make_unique<Transformer>(cfg, 12, at::kCPU, wire, ExpertShard{},
                                         TensorShard{group.rank(), e, e > 1 ? &group : nullptr, false});
  }
  SlicedWeightSync ws(sync, cfg, layout, 3000);  // small buckets: pieces span several, several share one
  int64_t version = rank == 0 ? 7 : -1;
  const WeightSyncStats stats = ws.sync(mine->parameters(), wire, &version, /*checksum=*/true);
  EXPECT_EQ(version, 7);
  int64_t held = 0;  // the real (unpadded) elements this engine rank holds
  if (!trainer) {
    const Transformer whole(cfg, 11, at::kCPU, at::kFloat);
    const StoredWhole stored{&cfg, TensorShard{group.rank(), e, &group, false}};
    std::map<std::string, at::Tensor> want;
    for (const auto& p : whole.parameters()) want[p.name] = stored.part_of(p.name, p.tensor).to(wire);
    int64_t received = 0;
    for (const auto& w : ws.plan().pieces())
      if (w.dst == sync.rank()) received += w.numel;
    for (const auto& p : mine->parameters()) {
      ASSERT_TRUE(want.count(p.name)) << p.name;
      const ParameterSplit split = parameter_split(p.name, cfg, e);
      at::Tensor expected = want.at(p.name);
      held += split.split() && split.padded > split.whole  // padded vocabulary rows are not sent
                  ? p.tensor.numel() / p.tensor.size(0) *
                        std::max<int64_t>(0, std::min(split.whole - group.rank() * (split.padded / e), split.padded / e))
                  : p.tensor.numel();
      EXPECT_TRUE(at::equal(p.tensor, expected)) << p.name << " on engine rank " << group.rank()
                                                 << ": max |diff| " << (p.tensor.to(at::kFloat) -
                                                                         expected.to(at::kFloat)).abs().max().item<float>();
    }
    EXPECT_EQ(received, held) << "an engine rank receives exactly its shard";
  }
  // The plan moves what the engine ranks hold, nothing more: each split tensor's slices
  // once per engine, the replicated ones (norms) to each engine rank.
  at::Tensor all_held = at::full({1}, held, at::kLong);
  allreduce(sync, all_held);
  EXPECT_EQ(ws.plan().total_elements(), all_held.item<int64_t>());
  EXPECT_EQ(stats.bytes, all_held.item<int64_t>() * int64_t(c10::elementSize(wire)));
  MPI_Comm_free(&group_mpi);
  MPI_Comm_free(&expert_mpi);
  MPI_Comm_free(&sync_mpi);
}

TEST(SlicedWeightSync, TrainerTp2ToOneRankEngines) {
  expect_sliced_sync_delivers_slices({2, 1, 2, 1}, false, at::kFloat);
}
TEST(SlicedWeightSync, TrainerTp2ToAnEngineOfTp2InBf16) {
  expect_sliced_sync_delivers_slices({2, 1, 1, 2}, false, at::kBFloat16);
}
TEST(SlicedWeightSync, TrainerTp1ToAnEngineOfTp2) { expect_sliced_sync_delivers_slices({1, 1, 1, 2}, false, at::kFloat); }
TEST(SlicedWeightSync, TrainerTp2ToAnEngineOfTp4) { expect_sliced_sync_delivers_slices({2, 1, 1, 4}, false, at::kFloat); }
TEST(SlicedWeightSync, ExpertsFromTwoDataParallelIndices) {
  expect_sliced_sync_delivers_slices({1, 2, 1, 2}, true, at::kFloat);
}
TEST(SlicedWeightSync, TrainerTp2xEp2ToAnEngineOfTp2) {
  expect_sliced_sync_delivers_slices({2, 2, 1, 2}, true, at::kFloat);
}
// Key/value heads replicated: on both sides (one head), on the engine's (two heads over
// four ranks), on the trainer's (two heads over four ranks to an engine of two).
TEST(SlicedWeightSync, ReplicatedKeyValueHeadsOnBothSides) {
  expect_sliced_sync_delivers_slices({2, 1, 1, 2}, false, at::kFloat, 1);
}
TEST(SlicedWeightSync, ReplicatedKeyValueHeadsOnTheEngine) {
  expect_sliced_sync_delivers_slices({2, 1, 1, 4}, false, at::kFloat, 2);
}
// A hybrid model's Gated DeltaNet layers, split by key heads on both sides.
TEST(SlicedWeightSync, HybridLayersFromTp2ToAnEngineOfTp4) {
  expect_sliced_sync_delivers_slices({2, 1, 1, 4}, false, at::kFloat, 4, 0, /*hybrid=*/true);
}
TEST(SlicedWeightSync, HybridLayersFromTp1ToAnEngineOfTp2InBf16) {
  expect_sliced_sync_delivers_slices({1, 1, 1, 2}, true, at::kBFloat16, 4, 0, /*hybrid=*/true);
}
// The draft travels with the policy: MTP layers sliced like the trunk's.
TEST(SlicedWeightSync, MtpLayersReachTheEnginesWithTheTrunk) {
  expect_sliced_sync_delivers_slices({2, 1, 1, 2}, false, at::kBFloat16, 4, /*mtp=*/1);
}
TEST(SlicedWeightSync, ReplicatedKeyValueHeadsOnTheTrainer) {
  expect_sliced_sync_delivers_slices({4, 1, 1, 2}, false, at::kFloat, 2);
}

// Delta sync on the sliced route (trainer TP 2 -> an engine of TP 2, np 4): the engine's
// shards after each delta equal those a whole sliced sync delivers, version after version
// (the trainer's shards change a little each time); anchors when due; a corrupted delta is
// caught by its receiver and the whole plan is sent again.
TEST(SlicedWeightSync, DeltasDeliverWhatWholeSyncsDo) {
  const SyncLayout layout{2, 1, 1, 2};
  const int rank = world_rank();
  if (world_size() < layout.n_members()) GTEST_SKIP() << "needs " << layout.n_members() << " ranks";
  MPI_Comm sync_mpi = sync_members(layout);
  if (sync_mpi == MPI_COMM_NULL) return;
  MpiComm sync(sync_mpi, "sliced_sync");
  const ModelConfig cfg = engine_model_config(false);
  const bool trainer = rank < layout.n_trainer_members();
  MPI_Comm group_mpi;
  MPI_Comm_split(sync_mpi, trainer ? 0 : 1, rank, &group_mpi);
  MpiComm group(group_mpi, "tensor");
  const TensorShard shard{group.rank(), 2, &group, false};
  const at::ScalarType wire = at::kBFloat16;
  std::unique_ptr<Transformer> mine, whole_copy;  // trainers: their shard; engines: by deltas, by whole syncs
  if (trainer) {
    mine = std::make_unique<Transformer>(cfg, 11, at::kCPU, at::kFloat, ExpertShard{}, shard);
  } else {
    mine = std::make_unique<Transformer>(cfg, 12, at::kCPU, wire, ExpertShard{}, shard);
    whole_copy = std::make_unique<Transformer>(cfg, 13, at::kCPU, wire, ExpertShard{}, shard);
  }
  SlicedWeightSync deltas(sync, cfg, layout, 3000, DeltaSyncConfig{true, 3});
  SlicedWeightSync wholes(sync, cfg, layout, 3000);
  for (int64_t v = 1; v <= 7; ++v) {
    if (trainer && v > 1) {  // a few elements of each shard move, as an optimizer step would
      at::NoGradGuard no_grad;
      for (const auto& p : mine->parameters()) {
        at::Tensor flat = p.tensor.view({-1});
        const int64_t k = std::max<int64_t>(1, flat.numel() / 50);
        flat.index_add_(0, at::arange(k, at::kLong) * 37 % flat.numel(), at::full({k}, 0.5, flat.options()));
      }
    }
    if (v == 5) setenv("SLIMPI_FAULT_DELTA_CORRUPT_AT", "5", 1);
    int64_t version = rank == 0 ? v : -1, again = version;
    const WeightSyncStats d = deltas.sync(mine->parameters(), wire, &version, false);
    unsetenv("SLIMPI_FAULT_DELTA_CORRUPT_AT");
    wholes.sync(trainer ? mine->parameters() : whole_copy->parameters(), wire, &again, false);
    EXPECT_EQ(version, v);
    // Anchors: the first sync, then every third; version 5's delta fails its check and goes whole.
    const bool anchor = v == 1 || v == 4 || v == 5 || v == 8;
    EXPECT_EQ(d.anchor, anchor) << "version " << v;
    EXPECT_EQ(d.resent, v == 5) << "version " << v;
    if (!anchor) EXPECT_LT(d.density, 0.2) << "version " << v;
    if (!trainer)
      for (size_t i = 0; i < mine->parameters().size(); ++i)
        EXPECT_TRUE(at::equal(mine->parameters()[i].tensor, whole_copy->parameters()[i].tensor))
            << mine->parameters()[i].name << " at version " << v;
  }
  MPI_Comm_free(&group_mpi);
  MPI_Comm_free(&sync_mpi);
}

}  // namespace
}  // namespace slimpi
