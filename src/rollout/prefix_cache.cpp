#include "rollout/prefix_cache.h"

#include <slimpi/error.h>

#include <algorithm>
#include <functional>

namespace slimpi {

PrefixCache::PrefixCache(BlockAllocator& allocator, int64_t block_size)
    : allocator_(allocator), block_size_(block_size) {}

PrefixCache::~PrefixCache() { clear(); }

void PrefixCache::touch(Node* n) {
  const bool leaf = n->children.empty();
  if (leaf) leaves_.erase({n->last_used, n});
  n->last_used = clock_;
  if (leaf) leaves_.insert({n->last_used, n});
}

std::vector<int32_t> PrefixCache::match_prefix(const std::vector<int64_t>& tokens, int64_t max_tokens) {
  std::vector<int32_t> out;
  Node* node = &root_;
  ++clock_;
  for (int64_t start = 0; start + block_size_ <= max_tokens; start += block_size_) {
    std::vector<int64_t> key(tokens.begin() + start, tokens.begin() + start + block_size_);
    auto it = node->children.find(key);
    if (it == node->children.end()) break;
    node = it->second.get();
    touch(node);
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
      if (node != &root_ && node->children.empty()) leaves_.erase({node->last_used, node});  // no longer a leaf
      it = node->children.emplace(key, std::move(child)).first;
      leaves_.insert({0, it->second.get()});  // touched just below
    }
    node = it->second.get();
    touch(node);
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
  auto it = leaves_.begin();
  while (freed < n && it != leaves_.end()) {
    Node* leaf = const_cast<Node*>(it->second);
    if (allocator_.refcount(leaf->block) != 1) {  // a running sequence still reads it
      ++it;
      continue;
    }
    it = leaves_.erase(it);
    Node* parent = leaf->parent;
    allocator_.unref(leaf->block);
    --n_nodes_;
    ++freed;
    parent->children.erase(leaf->key);  // destroys leaf
    if (parent != &root_ && parent->children.empty()) {
      // The parent is a leaf now; its last use is no older than the child's, so it sorts
      // at or after the position just left, unless it ties on last_used with a smaller
      // address: then continue from it.
      auto inserted = leaves_.insert({parent->last_used, parent}).first;
      if (it == leaves_.end() || *inserted < *it) it = inserted;
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

void PrefixCache::clear() {
  release_subtree(&root_);
  leaves_.clear();
}

}  // namespace slimpi
