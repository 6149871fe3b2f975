#include "rollout/block_allocator.h"

#include <slimpi/error.h>

namespace slimpi {

BlockAllocator::BlockAllocator(int64_t n_blocks) : refs_(n_blocks, 0) {
  SLIMPI_CHECK(n_blocks > 0, "KV cache of {} blocks", n_blocks);
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

std::optional<int32_t> BlockAllocator::allocate() {
  if (free_.empty()) return std::nullopt;
  int32_t b = free_.back();
  free_.pop_back();
  refs_[b] = 1;
  return b;
}

void BlockAllocator::ref(int32_t block) {
  SLIMPI_CHECK(refs_.at(block) > 0, "ref of free KV block {}", block);
  ++refs_[block];
}

void BlockAllocator::unref(int32_t block) {
  SLIMPI_CHECK(refs_.at(block) > 0, "unref of free KV block {}", block);
  if (--refs_[block] == 0) free_.push_back(block);
}

}  // namespace slimpi
