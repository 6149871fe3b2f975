// World split at np 1, 2, 4: communicator membership and sizes for both placements.
#include <gtest/gtest.h>

#include "parallel/world.h"
#include "../support/mpi_world.h"

namespace slimpi {
namespace {

using testing::world_rank;
using testing::world_size;

TEST(World, ColocateEveryRankHasEveryRole) {
  WorldLayout layout{Placement::Colocate, world_size(), world_size(), world_size()};
  World w(MPI_COMM_WORLD, layout);
  EXPECT_TRUE(w.is_trainer());
  EXPECT_TRUE(w.is_rollout());
  EXPECT_EQ(size_of(w.trainer()), world_size());
  EXPECT_EQ(size_of(w.rollout()), world_size());
  EXPECT_EQ(rank_in(w.trainer()), world_rank());
  EXPECT_EQ(w.sync(), MPI_COMM_NULL);  // colocate moves no weights
  std::string table = w.describe();
  if (world_rank() == 0) {
    EXPECT_NE(table.find("placement colocate"), std::string::npos);
    EXPECT_NE(table.find("trainer+rollout"), std::string::npos);
  }
}

// Every split of the world into trainers and rollout ranks that the size allows.
TEST(World, SplitMembershipAndSyncCommunicator) {
  const int n = world_size();
  if (n < 2) GTEST_SKIP() << "split placement needs 2 ranks";
  for (int n_trainer = 1; n_trainer < n; ++n_trainer) {
    WorldLayout layout{Placement::Split, n, n_trainer, n - n_trainer};
    World w(MPI_COMM_WORLD, layout);
    const int r = world_rank();
    const bool trainer = r < n_trainer;
    EXPECT_EQ(w.is_trainer(), trainer);
    EXPECT_EQ(w.is_rollout(), !trainer);
    if (trainer) {
      EXPECT_EQ(size_of(w.trainer()), n_trainer);
      EXPECT_EQ(rank_in(w.trainer()), r);
      EXPECT_EQ(w.rollout(), MPI_COMM_NULL);
    } else {
      EXPECT_EQ(size_of(w.rollout()), n - n_trainer);
      EXPECT_EQ(rank_in(w.rollout()), r - n_trainer);
      EXPECT_EQ(w.trainer(), MPI_COMM_NULL);
    }
    // sync = trainer rank 0 (sync rank 0) + every engine's first rank.
    if (r == 0 || !trainer) {
      EXPECT_EQ(size_of(w.sync()), 1 + (n - n_trainer));
      EXPECT_EQ(rank_in(w.sync()), r == 0 ? 0 : r - n_trainer + 1);
    } else {
      EXPECT_EQ(w.sync(), MPI_COMM_NULL);
    }
    // A broadcast over sync from the trainer root reaches every engine.
    if (w.sync() != MPI_COMM_NULL) {
      int value = r == 0 ? 4242 + n_trainer : -1;
      MPI_Bcast(&value, 1, MPI_INT, 0, w.sync());
      EXPECT_EQ(value, 4242 + n_trainer);
    }
    std::string table = w.describe();
    if (r == 0) {
      EXPECT_NE(table.find(std::to_string(n_trainer) + " trainer"), std::string::npos);
      EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), n + 1) << table;
    }
  }
}

}  // namespace
}  // namespace slimpi
