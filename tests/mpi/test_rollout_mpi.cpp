// The rollout side across ranks: the router returns every group exactly once with the
// same samples however many engines serve it (np 1, 2, and 3 as 1 trainer + 2
// engines); weight sync makes every engine's weights equal the trainer's, and delta
// sync (rollout.weight_sync = "delta") the same bytes as whole syncs, in fp32 and bf16:
// anchors when due, a corrupted delta caught and healed, a new sync object (a resumed
// job) starting with an anchor.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <slimpi/error.h>

#include "kernels/counter_rng.h"
#include "parallel/mpi_comm.h"
#include "parallel/world.h"
#include "rollout/router.h"
#include "sync/weight_delta.h"
#include "sync/weight_sync.h"
#include "tokenizer/byte_tokenizer.h"
#include "../support/tiny_model.h"
#include "../support/mpi_world.h"

namespace slimpi {
namespace {

using testing::world_rank;
using testing::world_size;

ModelConfig model_config() { return testing::tiny_model_config(64, 0.2); }

std::vector<GenerationRequest> requests() {
  std::vector<GenerationRequest> out;
  for (int g = 0; g < 12; ++g) {
    GenerationRequest r;
    r.group_index = g;
    r.prompt = {ByteTokenizer::kBos};
    for (int i = 0; i < 3 + g % 5; ++i) r.prompt.push_back((g * 13 + i * 5) % 256);
    r.n_samples = 4;
    r.params.max_new_tokens = 6 + (g * 7) % 20;  // uneven lengths: dynamic dispatch matters
    r.params.stop_token_ids = {ByteTokenizer::kEos};
    r.seed = mix_seed(7, 3, uint64_t(g));
    out.push_back(r);
  }
  return out;
}

TEST(Router, EveryGroupOnceAndTheSameSamplesAsOneEngine) {
  // np 3: 1 trainer + 2 engines (split); otherwise every rank is an engine.
  const int n = world_size();
  WorldLayout layout = n == 3 ? WorldLayout{Placement::Split, 3, 1, 2} : WorldLayout{Placement::Colocate, n, n, n};
  World world(MPI_COMM_WORLD, layout);
  Transformer model(model_config(), 11, at::kCPU);
  EngineConfig cfg{4, 2048, 8, 128, true};
  std::vector<Sample> routed;
  if (world.is_rollout()) {
    Engine engine(cfg, model);
    routed = route_rollout(engine, world.rollout(), cfg.max_running, requests());
  }
  if (rank_in(world.rollout()) != 0) {
    EXPECT_TRUE(routed.empty());
    return;
  }
  Engine alone(cfg, model);
  for (const auto& r : requests()) alone.add_request(r);
  std::vector<Sample> single = alone.run_to_completion();
  ASSERT_EQ(routed.size(), 48u);
  ASSERT_EQ(single.size(), 48u);
  for (size_t i = 0; i < routed.size(); ++i) {
    EXPECT_EQ(routed[i].group_index, int64_t(i / 4));
    EXPECT_EQ(routed[i].index, int64_t(i % 4));
    EXPECT_EQ(routed[i].response(), single[i].response()) << "group " << i / 4;
    EXPECT_EQ(routed[i].prompt(), requests()[i / 4].prompt);
  }
}

TEST(WeightSync, EnginesReceiveTheTrainersWeightsAndGenerateAccordingly) {
  const int r = world_rank();
  MpiComm sync(MPI_COMM_WORLD, "sync");
  Transformer trainer_model(model_config(), 1, at::kCPU);
  Transformer mine(model_config(), r == 0 ? 1 : 2, at::kCPU);  // engines start from other weights
  EngineConfig cfg{4, 1024, 8, 128, true};
  auto greedy = [&](const Transformer& m) {
    Engine e(cfg, m);
    auto reqs = requests();
    for (auto& q : reqs) {
      q.params.temperature = 0;
      q.n_samples = 1;
      e.add_request(q);
    }
    return e.run_to_completion();
  };
  Engine engine(cfg, mine);
  int64_t version = r == 0 ? 7 : -1;
  WeightSync ws(sync, 1000);  // small buckets: tensors span several
  WeightSyncStats stats = ws.sync(mine.parameters(), &version, /*checksum=*/true);
  engine.on_weights_updated(version);
  EXPECT_EQ(version, 7);
  EXPECT_EQ(engine.weight_version(), 7);
  EXPECT_EQ(stats.bytes, mine.n_params() * 4);
  EXPECT_GT(stats.n_buckets, 100);
  for (size_t i = 0; i < mine.parameters().size(); ++i)
    EXPECT_TRUE(at::equal(mine.parameters()[i].tensor, trainer_model.parameters()[i].tensor))
        << mine.parameters()[i].name;
  // Every rank hashed the same bytes.
  uint64_t lo = stats.checksum, hi = stats.checksum;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi);
  // The in-place path (the model's flat buffer) moves the same bytes.
  Transformer again(model_config(), r == 0 ? 1 : 3, at::kCPU);
  int64_t v2 = r == 0 ? 8 : -1;
  WeightSyncStats flat_stats = ws.sync(again.parameters(), &v2, true, again.flat_parameters());
  EXPECT_EQ(v2, 8);
  EXPECT_EQ(flat_stats.bytes, stats.bytes);
  EXPECT_EQ(flat_stats.checksum, stats.checksum);
  for (size_t i = 0; i < again.parameters().size(); ++i)
    EXPECT_TRUE(at::equal(again.parameters()[i].tensor, trainer_model.parameters()[i].tensor))
        << again.parameters()[i].name;
  // Generation follows the new weights.
  auto after = greedy(mine), expected = greedy(trainer_model);
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i].response(), expected[i].response());
  if (r != 0) {
    Transformer old(model_config(), 2, at::kCPU);
    auto before = greedy(old);
    bool any_differs = false;
    for (size_t i = 0; i < before.size(); ++i) any_differs |= before[i].response() != after[i].response();
    EXPECT_TRUE(any_differs);
  }
}

TEST(WeightSync, AMismatchedModelIsRefusedNamingTheTensors) {
  if (world_size() < 2) GTEST_SKIP() << "needs a receiver";
  MpiComm sync(MPI_COMM_WORLD, "sync");
  ModelConfig other = model_config();
  if (world_rank() != 0) other.intermediate_size = 48;
  Transformer m(other, 1, at::kCPU);
  int64_t version = 1;
  WeightSync ws(sync, 1 << 16);
  // Every rank fails (no rank is left waiting for buckets); the engines name tensors.
  try {
    ws.sync(m.parameters(), &version, false);
    ADD_FAILURE() << "accepted a different model";
  } catch (const Error& e) {
    const std::string what = e.what();
    if (world_rank() == 0) EXPECT_NE(what.find("refused by"), std::string::npos) << what;
    else EXPECT_NE(what.find("mlp.gate_proj.weight Float 48x32"), std::string::npos) << what;
  }
}

// The trainer's side of a delta test: a few elements of its weights change per version.
void perturb(at::Tensor& flat, int64_t version, double fraction) {
  at::NoGradGuard no_grad;
  at::Generator g = at::detail::createCPUGenerator(uint64_t(version));
  const int64_t n = flat.numel(), k = std::max<int64_t>(1, int64_t(double(n) * fraction));
  const at::Tensor idx = at::randint(n, {k}, g, at::kLong);
  flat.index_add_(0, idx, at::full({k}, 0.25, flat.options()));
}

class DeltaSyncTest : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(DeltaSyncTest, DeltasGiveTheBytesOfWholeSyncs) {
  if (world_size() < 2) GTEST_SKIP() << "needs a receiver";
  const at::ScalarType dtype = GetParam();
  const int r = world_rank();
  MpiComm sync(MPI_COMM_WORLD, "sync");
  Transformer mine(model_config(), r == 0 ? 1 : 2, at::kCPU, dtype);  // engines start from other weights
  at::Tensor flat = mine.flat_parameters();
  const int64_t total_bytes = flat.numel() * int64_t(flat.element_size());
  auto run = [&](WeightSync& ws, int64_t version) {
    if (r == 0 && version > 1) perturb(flat, version, 0.01);
    int64_t v = r == 0 ? version : -1;
    const WeightSyncStats s = ws.sync(mine.parameters(), &v, false, flat);
    EXPECT_EQ(v, version);
    // Every rank holds the root's bytes.
    at::Tensor all = at::empty({world_size(), flat.numel()}, flat.options());
    MPI_Allgather(flat.data_ptr(), int(total_bytes), MPI_BYTE, all.data_ptr(), int(total_bytes), MPI_BYTE,
                  MPI_COMM_WORLD);
    for (int k = 1; k < world_size(); ++k)
      EXPECT_TRUE(at::equal(all[k].view(at::kByte), all[0].view(at::kByte))) << "rank " << k << " version " << version;
    return s;
  };
  WeightSync ws(sync, 4096, DeltaSyncConfig{true, 4});  // small buckets: many of them, anchor every 4
  const WeightSyncStats first = run(ws, 1);
  EXPECT_TRUE(first.anchor);
  EXPECT_EQ(first.bytes, total_bytes);
  for (int64_t v = 2; v <= 4; ++v) {  // deltas: ~1% of the elements changed
    const WeightSyncStats d = run(ws, v);
    EXPECT_FALSE(d.anchor) << v;
    EXPECT_FALSE(d.resent) << v;
    if (r == 0) {
      EXPECT_GT(d.density, 0.004) << v;
      EXPECT_LT(d.density, 0.011) << v;
      EXPECT_LT(d.bytes, total_bytes / 10) << v;
    }
  }
  EXPECT_TRUE(run(ws, 5).anchor);  // the fourth sync since the anchor: whole again
  setenv("SLIMPI_FAULT_DELTA_CORRUPT_AT", "6", 1);  // rank 1 flips a byte after version 6's delta
  const WeightSyncStats healed = run(ws, 6);
  unsetenv("SLIMPI_FAULT_DELTA_CORRUPT_AT");
  EXPECT_TRUE(healed.resent);
  EXPECT_TRUE(healed.anchor);
  EXPECT_FALSE(run(ws, 7).anchor);  // deltas again after the re-sent whole
  WeightSync resumed(sync, 4096, DeltaSyncConfig{true, 4});  // a new job: the root holds no copy
  EXPECT_TRUE(run(resumed, 8).anchor);
  EXPECT_FALSE(run(resumed, 9).anchor);
}

INSTANTIATE_TEST_SUITE_P(Precisions, DeltaSyncTest, ::testing::Values(at::kFloat, at::kBFloat16),
                         [](const ::testing::TestParamInfo<at::ScalarType>& info) {
                           return std::string(info.param == at::kFloat ? "Fp32" : "Bf16");
                         });

TEST(WeightDelta, SparseOrRawWhicheverIsSmallerAndBitwise) {
  // bf16 words: -0.0 differs from 0.0; a NaN is equal to itself.
  at::Tensor before = at::zeros({64}, at::kBFloat16), now = before.clone();
  now[3] = -0.0;
  now[10] = 1.5;
  before[20] = std::numeric_limits<float>::quiet_NaN();
  now[20] = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor nb = now.view(at::kByte), bb = before.view(at::kByte);
  const BucketDelta d = encode_bucket(nb, bb, 2);
  EXPECT_EQ(d.kind, DeltaKind::Sparse);
  EXPECT_EQ(d.changed, 2);
  EXPECT_EQ(d.payload.numel(), 2 * (4 + 2));
  at::Tensor applied = bb.clone();
  apply_bucket(applied, d.kind, d.changed, d.payload, 2);
  EXPECT_TRUE(at::equal(applied, nb));
  // Over a third of the elements changed to bytes zstd cannot squeeze: the raw bytes are smaller.
  at::Generator gen = at::detail::createCPUGenerator(3);
  at::Tensor many = at::randint(0, 256, {128}, gen, at::kByte);
  const BucketDelta raw = encode_bucket(many, bb, 2);
  EXPECT_EQ(raw.kind, DeltaKind::Raw);
  at::Tensor applied2 = bb.clone();
  apply_bucket(applied2, raw.kind, raw.changed, raw.payload, 2);
  EXPECT_TRUE(at::equal(applied2, many));
}

// Half the elements moved by one unit in the last place (what a small learning rate
// does to bf16 weights): too many for the sparse form, but their XOR is nearly all
// zeros, and XOR + zstd is smallest; applied to the old copy it gives the new bytes.
TEST(WeightDelta, XorZstdWhenChangesAreManyButSmall) {
  at::Generator gen = at::detail::createCPUGenerator(4);
  const at::Tensor before = at::randn({4096}, gen).to(at::kBFloat16);
  at::Tensor words = before.view(at::kShort).clone();
  words.narrow(0, 0, 2048).add_(1);  // the lowest mantissa bit of the first half (no sign or exponent crossings matter)
  const at::Tensor now = words.view(at::kBFloat16);
  const at::Tensor nb = now.view(at::kByte), bb = before.view(at::kByte);
  const BucketDelta d = encode_bucket(nb, bb, 2);
  EXPECT_EQ(d.kind, DeltaKind::XorZstd);
  EXPECT_EQ(d.changed, 2048);
  EXPECT_LT(d.payload.numel(), nb.numel() / 4) << "zstd of the XOR: " << d.payload.numel() << " bytes";
  at::Tensor applied = bb.clone();
  apply_bucket(applied, d.kind, d.changed, d.payload, 2);
  EXPECT_TRUE(at::equal(applied, nb));
  // A frame that does not decompress to the bucket's size is an error, not a silent partial apply.
  EXPECT_THROW(apply_bucket(bb.narrow(0, 0, 100).clone(), d.kind, d.changed, d.payload, 2), Error);
}

}  // namespace
}  // namespace slimpi

