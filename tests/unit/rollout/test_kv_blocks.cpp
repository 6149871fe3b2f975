// Block allocator and prefix cache invariants.
#include <gtest/gtest.h>

#include <map>
#include <slimpi/error.h>

#include "rollout/prefix_cache.h"

namespace slimpi {
namespace {

TEST(BlockAllocator, RefcountsAndReuse) {
  BlockAllocator a(3);
  auto b0 = a.allocate(), b1 = a.allocate(), b2 = a.allocate();
  ASSERT_TRUE(b0 && b1 && b2);
  EXPECT_FALSE(a.allocate());
  EXPECT_EQ(a.n_free(), 0);
  a.ref(*b1);
  a.unref(*b1);
  EXPECT_EQ(a.n_free(), 0);  // still referenced once
  a.unref(*b1);
  EXPECT_EQ(a.n_free(), 1);
  EXPECT_EQ(a.allocate(), b1);
  EXPECT_THROW(a.unref(5), std::exception);
  a.unref(*b0);
  EXPECT_THROW(a.unref(*b0), Error);  // double free
}

std::vector<int64_t> seq(std::initializer_list<int64_t> v) { return v; }

TEST(PrefixCache, MatchesWholeBlocksOfTheLongestPrefix) {
  BlockAllocator a(8);
  PrefixCache cache(a, 2);
  std::vector<int64_t> t = seq({1, 2, 3, 4, 5});
  std::vector<int32_t> blocks{*a.allocate(), *a.allocate(), *a.allocate()};
  cache.insert(t, blocks, 5);  // two full blocks [1 2] [3 4]; the partial [5] is not cached
  EXPECT_EQ(cache.n_nodes(), 2);
  EXPECT_EQ(a.refcount(blocks[0]), 2);
  auto m = cache.match_prefix(seq({1, 2, 3, 4, 9, 9}), 5);
  EXPECT_EQ(m, (std::vector<int32_t>{blocks[0], blocks[1]}));
  EXPECT_EQ(a.refcount(blocks[1]), 3);  // the caller's reference
  EXPECT_EQ(cache.match_prefix(seq({1, 2, 3, 4}), 3).size(), 1u);  // never past max_tokens
  EXPECT_TRUE(cache.match_prefix(seq({2, 2, 3, 4}), 4).empty());
  for (int32_t b : m) a.unref(b);
  a.unref(blocks[0]);  // the first match_prefix(…, 3)
}

TEST(PrefixCache, EvictsOnlyUnreferencedLeavesLeastRecentlyUsedFirst) {
  BlockAllocator a(8);
  PrefixCache cache(a, 1);
  // Two chains: [7 8] and [5 6]; the sequences drop their own references.
  std::vector<int32_t> x{*a.allocate(), *a.allocate()}, y{*a.allocate(), *a.allocate()};
  cache.insert(seq({7, 8}), x, 2);
  cache.insert(seq({5, 6}), y, 2);
  for (int32_t b : x) a.unref(b);
  for (int32_t b : y) a.unref(b);
  EXPECT_EQ(a.n_free(), 4);
  EXPECT_EQ(cache.n_evictable(), 4);
  // Touch [7 8] so that [5 6] is the least recently used; hold its leaf.
  auto held = cache.match_prefix(seq({7, 8}), 2);
  EXPECT_EQ(cache.n_evictable(), 2);  // [7 8] is referenced by the caller now
  EXPECT_EQ(cache.evict(1), 1);
  EXPECT_EQ(a.refcount(y[1]), 0);   // [5 6]'s leaf went first
  EXPECT_EQ(cache.evict(10), 1);    // then [5]; [7 8] stays: it is held
  EXPECT_EQ(a.refcount(y[0]), 0);
  EXPECT_EQ(cache.n_nodes(), 2);
  for (int32_t b : held) a.unref(b);
  cache.clear();
  EXPECT_EQ(a.n_free(), 8);  // no leak
}

TEST(PrefixCache, EvictionOrderIsLeastRecentlyUsedLeafFirstAcrossATree) {
  // A tree: [1 2 3], [1 2 4], [1 5], [6 7], [8] (block size 1). Touch order after the
  // inserts makes the expected order: leaf 4, then 3, then 2 (became a leaf, touched with
  // them), then 8, then 7 and 6; [1 5] is held by a "running sequence" and so is 1.
  BlockAllocator a(16);
  PrefixCache cache(a, 1);
  std::map<std::vector<int64_t>, std::vector<int32_t>> blocks;
  auto put = [&](std::vector<int64_t> tokens) {
    std::vector<int32_t> b;
    for (size_t i = 0; i < tokens.size(); ++i) b.push_back(*a.allocate());
    cache.insert(tokens, b, int64_t(tokens.size()));
    for (int32_t x : b) a.unref(x);  // only the cache holds new blocks (shared ones stay)
    blocks[tokens] = b;
  };
  put({1, 2, 3});
  put({1, 2, 4});
  put({1, 5});
  put({6, 7});
  put({8});
  auto touch = [&](std::vector<int64_t> t) {
    for (int32_t b : cache.match_prefix(t, int64_t(t.size()))) a.unref(b);
  };
  touch({1, 2, 4});  // 4 older than 3 after the next touch
  touch({1, 2, 3});
  touch({8});
  touch({6, 7});
  auto held = cache.match_prefix({1, 5}, 2);  // holds 1 and 5
  auto freed_block = [&]() -> int32_t {
    std::vector<int> before(16);
    for (int32_t b = 0; b < 16; ++b) before[b] = a.refcount(b);
    EXPECT_EQ(cache.evict(1), 1);
    for (int32_t b = 0; b < 16; ++b)
      if (before[b] == 1 && a.refcount(b) == 0) return b;
    return -1;
  };
  const int32_t block_of_4 = blocks[{1, 2, 4}][2];
  const int32_t block_of_3 = blocks[{1, 2, 3}][2];
  const int32_t block_of_2 = blocks[{1, 2, 3}][1];
  const int32_t block_of_8 = blocks[{8}][0];
  const int32_t block_of_7 = blocks[{6, 7}][1];
  const int32_t block_of_6 = blocks[{6, 7}][0];
  // Last uses, oldest first: {1 2 4}, {1 2 3}, {8}, {6 7}.
  EXPECT_EQ(freed_block(), block_of_4);
  EXPECT_EQ(freed_block(), block_of_3);
  EXPECT_EQ(freed_block(), block_of_2);  // 2 became a leaf, last used with 3
  EXPECT_EQ(freed_block(), block_of_8);
  EXPECT_EQ(freed_block(), block_of_7);
  EXPECT_EQ(freed_block(), block_of_6);
  EXPECT_EQ(cache.evict(5), 0);  // what is left is held: 1 and 5
  EXPECT_EQ(cache.n_nodes(), 2);
  for (int32_t b : held) a.unref(b);
  EXPECT_EQ(cache.evict(5), 2);  // 5, then 1
  EXPECT_EQ(cache.n_nodes(), 0);
  EXPECT_EQ(a.n_free(), 16);
}

}  // namespace
}  // namespace slimpi
