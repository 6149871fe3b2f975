// PrefixCache — a radix tree over token ids whose edges are whole KV blocks: a path
// from the root spells a token prefix, each node holds the block with that prefix's
// last block_size tokens' keys/values. Lets a prompt re-use the KV of any earlier
// prompt of the same engine run that shared its first blocks (a system prompt, a
// few-shot header), and lets the n samples of a group find the prompt prefilled. The
// engine lives for the run, so the cache serves every generation round of one weight
// version (evaluation and the rollout's filter rounds); a weight update clears it.
//
// Owned by the Engine, next to the BlockAllocator it shares blocks with. The cache
// holds one reference to each node's block; eviction takes least-recently-used leaves
// whose block nobody else references. The leaves are kept in a set ordered by last use
// (SGLang's approach), so eviction walks them oldest first and never rescans or sorts
// the tree; a leaf still referenced by a running sequence is stepped over. A node's
// last use is never older than any of its descendants' (a lookup touches the whole
// path), so a parent that becomes a leaf sorts after the child just evicted.
// Invariants: a node's block is never free; leaves_ holds exactly the childless nodes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "rollout/block_allocator.h"

namespace slimpi {

class PrefixCache {
 public:
  PrefixCache(BlockAllocator& allocator, int64_t block_size);
  ~PrefixCache();

  // Blocks of the longest cached prefix of tokens[0, max_tokens) in whole blocks.
  // The caller receives one reference to each returned block.
  std::vector<int32_t> match_prefix(const std::vector<int64_t>& tokens, int64_t max_tokens);
  // Records the full blocks of tokens[0, n_tokens), whose KV is in `blocks`.
  void insert(const std::vector<int64_t>& tokens, const std::vector<int32_t>& blocks, int64_t n_tokens);
  // Frees up to `n` blocks that only the cache holds, least recently used first.
  int64_t evict(int64_t n);
  // Blocks that evict() could free now.
  int64_t n_evictable() const;
  // Drops every node (after a weight update the cached KV is stale).
  void clear();

  int64_t n_nodes() const { return n_nodes_; }
  int64_t block_size() const { return block_size_; }

 private:
  struct Node {
    std::vector<int64_t> key;  // this block's tokens
    int32_t block = -1;
    uint64_t last_used = 0;
    Node* parent = nullptr;
    std::map<std::vector<int64_t>, std::unique_ptr<Node>> children;
  };
  using LeafKey = std::pair<uint64_t, const Node*>;  // (last_used, node): oldest first
  void touch(Node* n);                                // last_used = now, keeping leaves_ ordered
  void release_subtree(Node* n);

  BlockAllocator& allocator_;
  int64_t block_size_;
  Node root_;
  std::set<LeafKey> leaves_;
  uint64_t clock_ = 0;
  int64_t n_nodes_ = 0;
};

}  // namespace slimpi
