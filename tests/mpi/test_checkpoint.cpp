// Checkpoint pieces at np 1, 2, 4: run_state.h5 gathers every rank's RNG and gives
// each rank its own back; manifests catch a flipped byte, a truncated file, a missing
// file and a missing DONE; pruning keeps keep_last complete checkpoints plus the
// keep_every multiples, and drops unfinished ones older than the newest complete one.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <slimpi/deck.h>

#include <filesystem>
#include <fstream>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/resume.h"
#include "ckpt/run_state.h"
#include "io/h5.h"
#include "shared_tmp.h"
#include "../support/mpi_world.h"

namespace slimpi {
namespace {

using testing::world_rank;

namespace fs = std::filesystem;

TEST(RunState, EveryRankGetsItsOwnRngBack) {
  testing::SharedTmpDir dir;
  const std::string path = dir.path() + "/run_state.h5";
  at::manual_seed(100 + world_rank());
  at::rand({3});  // some draws before the checkpoint
  const std::vector<uint8_t> mine = ckpt::local_rng_state();
  ckpt::RunState s;
  s.step = 12;
  s.prompt_cursor = 345;
  s.prompt_epoch = 2;
  s.layout = "split: 4 ranks, 2 trainer + 2 rollout";
  s.reached_target = true;
  s.reached_pass1 = 0.625;
  ckpt::write_run_state(MPI_COMM_WORLD, path, s);
  const float next = at::rand({1}).item<float>();  // what this rank draws after the checkpoint
  MPI_Barrier(MPI_COMM_WORLD);

  const ckpt::RunState back = ckpt::read_run_state(path);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ASSERT_EQ(back.rng_per_rank.size(), size_t(size));
  EXPECT_EQ(back.step, 12);
  EXPECT_EQ(back.prompt_cursor, 345);
  EXPECT_EQ(back.prompt_epoch, 2);
  EXPECT_EQ(back.pending_groups, 0);
  EXPECT_EQ(back.layout, s.layout);
  EXPECT_TRUE(back.reached_target);
  EXPECT_EQ(back.reached_pass1, 0.625);
  EXPECT_EQ(back.rng_per_rank[world_rank()], mine);
  if (size > 1) EXPECT_NE(back.rng_per_rank[0], back.rng_per_rank[1]);
  at::manual_seed(999);
  ckpt::restore_local_rng_state(back.rng_per_rank[world_rank()]);
  EXPECT_EQ(at::rand({1}).item<float>(), next);
}

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(CheckpointDir, ManifestCatchesEveryKindOfDamage) {
  testing::SharedTmpDir shared;
  const std::string root = shared.path() + "/rank" + std::to_string(world_rank());
  EXPECT_EQ(ckpt::step_dir_name(42), "step_00000042");
  EXPECT_EQ(ckpt::parse_step_dir_name("step_00000042"), std::optional<int64_t>(42));
  EXPECT_FALSE(ckpt::parse_step_dir_name("step_4x"));
  EXPECT_FALSE(ckpt::parse_step_dir_name("other"));

  const std::string dir = root + "/" + ckpt::step_dir_name(3);
  fs::create_directories(dir);
  write_file(dir + "/a.bin", std::string(5000, 'a'));
  write_file(dir + "/b.txt", "hello");
  ckpt::write_manifest(dir, {"a.bin", "b.txt"});
  EXPECT_EQ(ckpt::verify_checkpoint(dir), std::optional<std::string>("no DONE marker (the checkpoint was not finished)"));
  ckpt::write_done_marker(dir, 3);
  EXPECT_EQ(ckpt::verify_checkpoint(dir), std::nullopt);

  write_file(dir + "/b.txt", "hellO");  // same size, one byte flipped
  auto problem = ckpt::verify_checkpoint(dir);
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("b.txt: checksum"), std::string::npos) << *problem;
  write_file(dir + "/b.txt", "hell");
  problem = ckpt::verify_checkpoint(dir);
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("b.txt: 4 bytes, the manifest says 5"), std::string::npos) << *problem;
  fs::remove(dir + "/b.txt");
  EXPECT_EQ(ckpt::verify_checkpoint(dir), std::optional<std::string>("b.txt: missing"));
  write_file(dir + "/manifest.json", "{not json");
  problem = ckpt::verify_checkpoint(dir);
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("manifest.json is malformed"), std::string::npos) << *problem;
}

// A checkpoint that verifies (its manifest matches) but contradicts itself is named, not
// resumed: run_state.h5's step against the directory's name (steps would be skipped),
// and a PPO run's trainer_state.h5 without its critic (the critic would be a copy).
TEST(CheckpointDir, InconsistenciesAreNamed) {
  testing::SharedTmpDir shared;
  const std::string root = shared.path() + "/rank" + std::to_string(world_rank());
  const std::string dir = root + "/" + ckpt::step_dir_name(3);
  fs::create_directories(dir);
  ckpt::RunState s;
  s.step = 5;
  ckpt::write_run_state(MPI_COMM_SELF, dir + "/run_state.h5", s);
  write_file(root + "/grpo.toml", "[train]\nmode = \"rl\"\n");
  write_file(root + "/ppo.toml", "[train]\nmode = \"rl\"\nadvantage_estimator = \"ppo\"\n");
  const Deck grpo = load_deck(root + "/grpo.toml", {}), ppo = load_deck(root + "/ppo.toml", {});
  auto problems = ckpt::checkpoint_inconsistencies(dir, grpo);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("run_state.h5 says step 5, but the directory is named for step 3"), std::string::npos)
      << problems[0];
  EXPECT_EQ(ckpt::checkpoint_inconsistencies(dir + "/", grpo).size(), 1u);  // a trailing slash changes nothing
  const std::string renamed = root + "/" + ckpt::step_dir_name(5);
  fs::rename(dir, renamed);
  EXPECT_TRUE(ckpt::checkpoint_inconsistencies(renamed, grpo).empty());
  {
    h5::File f = h5::File::create(renamed + "/trainer_state.h5", MPI_COMM_NULL);
    h5::create_group(f.id(), "model");
  }
  problems = ckpt::checkpoint_inconsistencies(renamed, ppo);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("trainer_state.h5 holds no critic group"), std::string::npos) << problems[0];
  {
    h5::File f = h5::File::open(renamed + "/trainer_state.h5", /*writable=*/true, MPI_COMM_NULL);
    h5::create_group(f.id(), "critic");
  }
  EXPECT_TRUE(ckpt::checkpoint_inconsistencies(renamed, ppo).empty());
}

TEST(CheckpointDir, PruneKeepsTheNewestAndTheKeepEveryMultiples) {
  testing::SharedTmpDir shared;
  const std::string root = shared.path() + "/rank" + std::to_string(world_rank());
  auto make = [&](int64_t step, bool done) {
    const std::string dir = root + "/" + ckpt::step_dir_name(step);
    fs::create_directories(dir);
    if (done) ckpt::write_done_marker(dir, step);
  };
  for (int64_t s : {2, 4, 6, 8, 10}) make(s, true);
  make(5, false);   // unfinished, older than a complete one: removed
  make(12, false);  // unfinished, the newest (a write in progress): kept
  const auto removed = ckpt::prune_checkpoints(root, /*keep_last=*/2, /*keep_every=*/4);
  EXPECT_EQ(ckpt::list_step_dirs(root), (std::vector<int64_t>{12, 10, 8, 4}));
  EXPECT_EQ(removed.size(), 3u);  // 6, 5, 2
  ckpt::prune_checkpoints(root, /*keep_last=*/0, 0);  // 0 = keep all complete ones
  EXPECT_EQ(ckpt::list_step_dirs(root), (std::vector<int64_t>{12, 10, 8, 4}));
}

}  // namespace
}  // namespace slimpi
