// BlockAllocator — the pool of fixed-size KV-cache blocks of one engine, with
// reference counts. A block is free exactly when its count is 0. Sequences that share
// a prompt prefix and the prefix cache each hold one reference to a shared block.
// Owned by the Engine; single-threaded.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace slimpi {

class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t n_blocks);

  // A free block with count 1, or nullopt when none is free.
  std::optional<int32_t> allocate();
  void ref(int32_t block);
  // Drops one reference; the block is free again at 0.
  void unref(int32_t block);

  int32_t refcount(int32_t block) const { return refs_.at(block); }
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t n_blocks() const { return static_cast<int64_t>(refs_.size()); }

 private:
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // stack of free block ids (lowest id on top first)
};

}  // namespace slimpi
