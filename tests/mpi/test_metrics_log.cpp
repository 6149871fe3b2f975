// MetricsLog at np 1, 2, 4: rank 0's values become rows, late columns read NaN (empty
// in the CSV), and /ranks holds one row per rank per step.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <fstream>
#include <sstream>

#include "io/metrics_log.h"
#include "shared_tmp.h"

namespace slimpi {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(MetricsLog, RowsColumnsCsvAndPerRankRows) {
  testing::SharedTmpDir tmp;
  int r = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  {
    MetricsLog log(tmp.path(), MPI_COMM_WORLD, "deck");
    // Other ranks pass different values: only rank 0's count.
    log.log_step(0, {{"train/loss", r == 0 ? 2.5 : -1.0}});
    log.log_ranks(0, {{"time/step_s", 0.5 * r}});
    log.log_step(1, {{"train/loss", r == 0 ? 2.0 : -1.0}, {"perf/step_time", 0.25}});
    log.log_ranks(1, {{"time/step_s", 1.0 + r}, {"time/train_s", 2.0 * r}});
    log.log_step(2, {{"perf/step_time", 0.125}});
    // A logged non-finite value reads as such in the CSV, unlike an unlogged one.
    log.log_step(3, {{"train/loss", std::numeric_limits<double>::quiet_NaN()},
                     {"perf/step_time", std::numeric_limits<double>::infinity()}});
    EXPECT_EQ(log.columns(), (std::vector<std::string>{"train/loss", "perf/step_time"}));
    EXPECT_EQ(log.n_rows(), 4u);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (r == 0) {
    EXPECT_EQ(read_text(tmp.file("metrics.csv")),
              "step,train/loss,perf/step_time\n"
              "0,2.5,\n"
              "1,2,0.25\n"
              "2,,0.125\n"
              "3,nan,inf\n");
  }
  h5::File f = h5::File::open(tmp.file("metrics.h5"), false, MPI_COMM_NULL);
  auto loss = h5::AppendableDataset<double>::open(f, f.id(), "steps/train/loss").read();
  auto step_time = h5::AppendableDataset<double>::open(f, f.id(), "steps/perf/step_time").read();
  auto steps = h5::AppendableDataset<int64_t>::open(f, f.id(), "steps/step").read();
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 1, 2, 3}));
  ASSERT_EQ(loss.size(), 4u);
  EXPECT_EQ(loss[0], 2.5);
  EXPECT_EQ(loss[1], 2.0);
  EXPECT_TRUE(std::isnan(loss[2]));
  EXPECT_TRUE(std::isnan(step_time[0]));
  EXPECT_EQ(step_time[2], 0.125);

  auto rank_col = h5::AppendableDataset<int64_t>::open(f, f.id(), "ranks/rank").read();
  auto step_s = h5::AppendableDataset<double>::open(f, f.id(), "ranks/time/step_s").read();
  auto train_s = h5::AppendableDataset<double>::open(f, f.id(), "ranks/time/train_s").read();
  ASSERT_EQ(rank_col.size(), size_t(2 * n));
  ASSERT_EQ(train_s.size(), size_t(2 * n));
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(rank_col[q], q);
    EXPECT_EQ(step_s[q], 0.5 * q);
    EXPECT_EQ(step_s[n + q], 1.0 + q);
    EXPECT_TRUE(std::isnan(train_s[q]));  // the column appeared at step 1
    EXPECT_EQ(train_s[n + q], 2.0 * q);
  }
}

}  // namespace
}  // namespace slimpi
