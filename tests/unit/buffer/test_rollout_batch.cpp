// The rollout metrics of a batch (buffer/rollout_batch.h) as a pure function, on a batch
// made by hand: two kept groups of 2, one of them with rewards that agree; and retire().
#include <gtest/gtest.h>
#include <slimpi/error.h>

#include <cmath>

#include "buffer/rollout_batch.h"

namespace slimpi {
namespace {

Sample sample(int64_t group, int64_t index, int64_t response_tokens, float raw, float reward,
              std::vector<int64_t> versions = {}) {
  Sample s;
  s.group_index = group;
  s.index = index;
  s.prompt_length = 3;
  s.tokens.assign(size_t(3 + response_tokens), 7);
  s.raw_reward = raw;
  s.reward = reward;
  s.status = SampleStatus::Completed;
  s.weight_versions = std::move(versions);
  return s;
}

TEST(RolloutMetrics, MeansCountsAndStaleness) {
  RolloutBatch b;
  b.kept = {sample(0, 0, 2, 1.0f, 0.5f, {9, 9}), sample(0, 1, 4, 0.0f, -0.5f, {8, 9, 9, 9}),
            sample(1, 0, 6, 1.0f, 0.0f), sample(1, 1, 8, 1.0f, 0.0f)};
  b.kept[3].status = SampleStatus::Truncated;
  b.groups_generated = 5;
  b.groups_dropped = 2;
  b.rounds = 2;
  b.score_s = 0.25;
  b.generate_s = 2.0;
  b.engine_stats.generated_tokens = 100;
  b.engine_stats.prefix_hit_tokens = 30;
  b.engine_stats.prefix_query_tokens = 120;
  b.engine_stats.iterations = 10;
  b.engine_stats.forward_s = 0.4;
  b.engine_stats.sample_s = 0.1;
  const auto m = rollout_metrics(b, {/*step=*/10, /*n_samples_per_prompt=*/2, /*rollout_batch_size=*/3,
                                     /*skipped_lines=*/1, /*prompt_cursor=*/42, /*epoch=*/0});
  EXPECT_DOUBLE_EQ(m.at("rollout/raw_reward"), 0.75);
  EXPECT_DOUBLE_EQ(m.at("rollout/rewards"), 0.0);
  EXPECT_DOUBLE_EQ(m.at("rollout/response_len/mean"), 5.0);
  EXPECT_DOUBLE_EQ(m.at("rollout/response_len/max"), 8.0);
  EXPECT_DOUBLE_EQ(m.at("rollout/truncated_ratio"), 0.25);
  EXPECT_DOUBLE_EQ(m.at("rollout/zero_std/count"), 1.0);  // group 1: both rewards 1
  EXPECT_DOUBLE_EQ(m.at("rollout/short_batch_groups"), 1.0);  // 2 kept of 3
  EXPECT_DOUBLE_EQ(m.at("rollout/dynamic_filter/drop_zero_std"), 2.0);
  EXPECT_DOUBLE_EQ(m.at("rollout/groups_generated"), 5.0);
  EXPECT_DOUBLE_EQ(m.at("rollout/sampling_rounds"), 2.0);
  EXPECT_DOUBLE_EQ(m.at("rollout/prefix_cache_hit_rate"), 0.25);
  EXPECT_DOUBLE_EQ(m.at("rollout/prompt_cursor"), 42.0);
  EXPECT_DOUBLE_EQ(m.at("rollout/skipped_lines"), 1.0);
  EXPECT_DOUBLE_EQ(m.at("perf/rollout_tokens_per_s"), 50.0);
  EXPECT_DOUBLE_EQ(m.at("perf/engine_iteration_s"), 0.05);
  EXPECT_DOUBLE_EQ(m.at("perf/reward_score_time"), 0.25);
  // Staleness: the oldest token's version against step 10 (no versions: this step's).
  EXPECT_DOUBLE_EQ(m.at("rollout/staleness/max"), 2.0);
  EXPECT_DOUBLE_EQ(m.at("rollout/staleness/mean"), (1.0 + 2.0) / 4.0);
}

TEST(RolloutMetrics, EmptyBatchHasNoRates) {
  const auto m = rollout_metrics(RolloutBatch(), {0, 4, 8, 0, 0, 0});
  EXPECT_DOUBLE_EQ(m.at("rollout/raw_reward"), 0.0);
  EXPECT_DOUBLE_EQ(m.at("rollout/short_batch_groups"), 8.0);
  EXPECT_EQ(m.count("perf/rollout_tokens_per_s"), 0u);
  EXPECT_EQ(m.count("perf/engine_iteration_s"), 0u);
}

TEST(Retire, StatusAndReward) {
  Sample s = sample(0, 0, 1, 1.0f, 0.7f);
  retire(s, SampleStatus::Filtered);
  EXPECT_EQ(s.status, SampleStatus::Filtered);
  EXPECT_EQ(s.reward, 0.0f);
  EXPECT_EQ(s.raw_reward, 1.0f);
  retire(s, SampleStatus::Surplus);
  EXPECT_TRUE(std::isnan(s.reward));
  EXPECT_THROW(retire(s, SampleStatus::Completed), Error);
}

}  // namespace
}  // namespace slimpi
