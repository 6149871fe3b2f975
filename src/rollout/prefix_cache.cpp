#include "rollout/prefix_cache.h"

#include <slimpi/error.h>

#include <algorithm>
#include <functional>

namespace slimpi {

PrefixCache::PrefixCache(BlockAllocator& allocator, int64_t block_size)
    : allocator_(allocator), block_size_(block_size) {}

PrefixCache::~PrefixCache() { clear(); }

std::vector<int32_t> PrefixCache::match_prefix(const std::vector<int64_t>& tokens, int64_t max_tokens) {
  std::vector<int32_t> out;
  Node* node = &root_;
  ++clock_;
  for (int64_t start = 0; start + block_size_ <= max_tokens; start += block_size_) {
    std::vector<int64_t> key(tokens.begin() + start, tokens.begin() + start + block_size_);
    auto it = node->children.find(key);
    if (it == node->children.end()) break;
    node = it->second.get();
    node->last_used = clock_;
    allocator_.ref(node->block);
    out.push_back(node->block);
  }
  return out;
}

void PrefixCache::insert(const std::vector<int64_t>& tokens, const std::vector<int32_t>& blocks, int64_t n_tokens) {
  Node* node = &root_;
  ++clock_;
  for (int64_t start = 0, b = 0; start + block_size_ <= n_tokens; start += block_size_, ++b) {
    std::vector<int64_t> key(tokens.begin() + start, tokens.begin() + start + block_size_);
    auto it = node->children.find(key);
    if (it == node->children.end()) {
      auto child = std::make_unique<Node>();
      child->key = key;
      child->block = blocks.at(b);
      child->parent = node;
      allocator_.ref(child->block);
      ++n_nodes_;
      it = node->children.emplace(key, std::move(child)).first;
    }
    node = it->second.get();
    node->last_used = clock_;
  }
}

void PrefixCache::collect_evictable(Node* n, std::vector<Node*>& out) const {
  for (auto& [k, c] : n->children) {
    if (c->children.empty()) {
      if (allocator_.refcount(c->block) == 1) out.push_back(c.get());
    } else {
      collect_evictable(c.get(), out);
    }
  }
}

int64_t PrefixCache::n_evictable() const {
  // Leaves free up blocks one after another: a chain whose blocks only the cache
  // holds can be freed whole, so count every node held by the cache alone whose
  // subtree is held by the cache alone.
  int64_t count = 0;
  std::function<bool(const Node*)> only_cache = [&](const Node* n) {
    bool all = true;
    for (const auto& [k, c] : n->children) all = only_cache(c.get()) && all;
    if (n == &root_) return all;
    bool mine = all && allocator_.refcount(n->block) == 1;
    if (mine) ++count;
    return mine;
  };
  only_cache(&root_);
  return count;
}

int64_t PrefixCache::evict(int64_t n) {
  int64_t freed = 0;
  while (freed < n) {
    std::vector<Node*> leaves;
    collect_evictable(&root_, leaves);
    if (leaves.empty()) break;
    std::sort(leaves.begin(), leaves.end(), [](const Node* a, const Node* b) { return a->last_used < b->last_used; });
    for (Node* leaf : leaves) {
      if (freed >= n) break;
      Node* parent = leaf->parent;
      allocator_.unref(leaf->block);
      --n_nodes_;
      ++freed;
      parent->children.erase(leaf->key);  // destroys leaf
    }
  }
  return freed;
}

void PrefixCache::release_subtree(Node* n) {
  for (auto& [k, c] : n->children) {
    release_subtree(c.get());
    allocator_.unref(c->block);
    --n_nodes_;
  }
  n->children.clear();
}

void PrefixCache::clear() { release_subtree(&root_); }

}  // namespace slimpi
