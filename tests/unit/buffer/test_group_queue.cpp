// train.async = "full"'s group queue (buffer/group_queue.h): filtered and stale groups
// retired with their status, a stale prompt drawn again with "regenerate", batches
// taken in finishing order, off-policy tokens masked.
#include <gtest/gtest.h>

#include <cmath>

#include "buffer/group_queue.h"
#include "buffer/rollout_batch.h"

namespace slimpi {
namespace {

GroupQueue::Group group(int64_t index, std::vector<std::vector<int64_t>> versions) {
  GroupQueue::Group g;
  g.prompt.index = index;
  g.prompt.text = "prompt " + std::to_string(index);
  for (size_t i = 0; i < versions.size(); ++i) {
    Sample s;
    s.group_index = index;
    s.index = int64_t(i);
    s.prompt_length = 1;
    s.tokens.assign(1 + versions[i].size(), 5);
    s.weight_versions = versions[i];
    s.raw_reward = float(i);
    s.status = SampleStatus::Completed;
    g.samples.push_back(std::move(s));
  }
  return g;
}

TEST(GroupQueue, FilteredStaleAndRegenerated) {
  std::map<std::string, double> counts;
  GroupQueue q(/*max_staleness=*/1, /*regenerate_stale=*/true, counts);
  q.add(group(0, {{3, 3}, {3, 3}}), /*kept=*/true, /*step=*/4);   // 1 behind: queued
  q.add(group(1, {{2, 2}, {2, 2}}), true, 4);                     // 2 behind: stale at once
  q.add(group(2, {{4}, {4}}), /*kept=*/false, 4);                  // filtered
  EXPECT_EQ(q.n_groups(), 1);
  EXPECT_EQ(counts["rollout/async/stale_regenerated_groups"], 1.0);
  ASSERT_EQ(q.redraws().size(), 1u);
  EXPECT_EQ(q.next_redraw()->index, 1);
  EXPECT_FALSE(q.next_redraw().has_value());
  q.retire_stale(/*step=*/5);  // group 0 is now 2 behind
  EXPECT_EQ(q.n_groups(), 0);
  RolloutBatch b;
  EXPECT_EQ(q.take(4, 5, false, b), 0);
  EXPECT_TRUE(b.kept.empty());
  ASSERT_EQ(b.unused.size(), 6u);
  int filtered = 0, stale = 0;
  for (const Sample& s : b.unused) {
    EXPECT_EQ(s.step, 5);
    filtered += s.status == SampleStatus::Filtered;
    stale += s.status == SampleStatus::Stale;
    if (s.status == SampleStatus::Stale) EXPECT_TRUE(std::isnan(s.reward));
  }
  EXPECT_EQ(filtered, 2);
  EXPECT_EQ(stale, 4);
}

TEST(GroupQueue, TakesInFinishingOrderAndMasksOffPolicyTokens) {
  std::map<std::string, double> counts;
  GroupQueue q(/*max_staleness=*/-1, /*regenerate_stale=*/false, counts);
  q.add(group(7, {{1, 2, 2}, {2, 2, 2}}), true, 2);
  q.add(group(3, {{2}, {2}}), true, 2);
  RolloutBatch b;
  EXPECT_EQ(q.take(1, 2, /*mask_offpolicy=*/true, b), 1);  // sample 0 of group 7 spans versions 1..2
  ASSERT_EQ(b.kept.size(), 2u);
  EXPECT_EQ(b.kept[0].group_index, 7);
  EXPECT_EQ(b.kept[0].loss_mask, (std::vector<float>{0.0f, 1.0f, 1.0f}));
  EXPECT_TRUE(b.kept[1].loss_mask.empty());
  EXPECT_EQ(q.n_groups(), 1);
  EXPECT_TRUE(counts.empty());  // nothing stale without a bound
  // An episode's mask (its environment's tokens 0) stays under the off-policy mask.
  GroupQueue::Group episodes = group(9, {{1, 2, 2, 2}, {2}});
  episodes.samples[0].loss_mask = {1.0f, 1.0f, 0.0f, 1.0f};
  q.add(std::move(episodes), true, 2);
  RolloutBatch c;
  q.take(2, 3, /*mask_offpolicy=*/true, c);
  ASSERT_EQ(c.kept.size(), 4u);
  EXPECT_EQ(c.kept[2].group_index, 9);
  EXPECT_EQ(c.kept[2].loss_mask, (std::vector<float>{0.0f, 1.0f, 0.0f, 1.0f}));
}

}  // namespace
}  // namespace slimpi
