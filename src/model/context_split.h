// ContextSplit — a packed batch's tokens split over a context-parallel group
// (parallel.context_parallel = c), Megatron's load-balanced causal split, and the
// gathers that cross it. Built per forward from the batch's sequence lengths, the same
// on every rank of the group; immutable.
//
// Sequence b of L_b tokens is cut into 2c chunks, chunk j = positions
// [⌊j·L_b / 2c⌋, ⌊(j+1)·L_b / 2c⌋), and rank i of the group holds chunks i and 2c−1−i:
// an early chunk (few keys) with a late one (many), so every rank's share of the causal
// attention is about the same. Nothing is padded: a sequence shorter than 2c tokens
// leaves some chunks empty (a one-token sequence sits on rank 0 alone), and a rank may
// hold no token of a batch at all; it still runs every collective of the forward and
// the backward (the gathers below are collective over the group).
//
// Rank i's rows ("local rows") are its tokens in packed order; everything between the
// embedding and the final norm runs on them (T_i rows instead of T). Attention reads
// every key of its sequences: gather_rows (all-gather forward, reduce-scatter backward:
// each rank's keys get the gradient every rank's queries give them). What the losses
// read (per-token log-probs, entropies, values, router logits) is computed on the local
// rows and gathered into the whole batch's order with gather_items (all-gather forward,
// own rows backward), so each rank of the group computes the same loss over every
// token, and its backward reaches its own tokens only: the gradients summed over the
// group are the one-rank gradients.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

namespace slimpi {

class Comm;

// A model's place in a context-parallel group (size 1: every token on every rank).
struct ContextShard {
  int rank = 0, size = 1;
  Comm* comm = nullptr;  // the group (required when size > 1)
};

class ContextSplit {
 public:
  // One chunk of this rank's: positions [begin, end) of sequence `seq`, whose first
  // token is packed row `seq_start`; its rows are local rows [local_start, + end − begin).
  struct Chunk {
    int64_t seq, seq_start, begin, end, local_start;
  };
  // The items of one gather: which of n rows (or row-bound values) this rank computes,
  // and where every rank's land in the gathered order.
  struct Items {
    at::Tensor local_items;  // [n_i] int64 indices into the n items this rank computes, increasing
    at::Tensor local_rows;   // [n_i] int64 the local row of each (for rows this rank holds)
    at::Tensor gathered_at;  // [n] int64 each item's row in the padded all-gather [c · max_count]
    int64_t max_count = 0;   // the most items any rank computes
  };

  ContextSplit(const ContextShard& shard, const std::vector<int64_t>& seq_lens, const at::Device& device);

  const ContextShard& shard() const { return shard_; }
  const std::vector<int64_t>& seq_lens() const { return seq_lens_; }
  int64_t n_tokens() const { return n_tokens_; }  // T, the whole batch's
  int64_t n_local() const { return int64_t(local_rows_host_.size()); }
  // [T_i] int64 the packed rows this rank holds, increasing.
  const at::Tensor& local_rows() const { return local_rows_; }
  const std::vector<Chunk>& chunks() const { return chunks_; }
  // The rank holding packed row `row`.
  int owner(int64_t row) const { return owner_[size_t(row)]; }

  // rows [n] int64 (packed rows, host or device; each item bound to the rank holding
  // its row) -> the items' split.
  Items items(const at::Tensor& rows) const;
  // Every row as an item, in packed order (a per-token output of the rows gathered).
  const Items& all_rows() const { return all_rows_; }
  // local [n_i, ...] (this rank's items, in `it.local_items` order) -> [n, ...] every
  // rank's, in item order. Backward: each rank keeps its own items' gradient (every rank
  // computes the same function of the result).
  at::Tensor gather_items(const Items& it, const at::Tensor& local) const;
  // local [T_i, ...] (this rank's rows) -> [T, ...] every row in packed order. Backward:
  // each rank's rows get the gradient summed over the group.
  at::Tensor gather_rows(const at::Tensor& local) const;

 private:
  Items items_of(const std::vector<int64_t>& rows) const;

  ContextShard shard_;
  at::Device device_;
  std::vector<int64_t> seq_lens_;
  int64_t n_tokens_ = 0;
  std::vector<int> owner_;               // [T] the rank holding each packed row
  std::vector<int64_t> local_index_;     // [T] each row's index among its owner's rows
  std::vector<int64_t> local_rows_host_;
  at::Tensor local_rows_;
  std::vector<Chunk> chunks_;
  Items all_rows_;  // every row as an item (gather_rows)
};

}  // namespace slimpi
