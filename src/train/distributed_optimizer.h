// DistributedAdamW — Megatron's distributed optimizer (ZeRO-1; train.distributed_optimizer)
// for the parameters of one GradBuffer, sharded over the group that reduces that buffer
// (the data-parallel group; an expert shard's replicas for the experts' buffer).
//
// Each bucket of the buffer, padded to a multiple of the group size d, splits into d
// equal chunks; rank r owns chunk r of every bucket. A chunk may cut through a
// parameter: each parameter's part of a chunk is a segment. The fp32 AdamW moments
// exist only for this rank's chunks (8/d bytes a parameter instead of 8); everything
// else works in place in the gradient buffer, as Megatron's does (no buffer of its own
// for the summed chunks or the all-gather). A step:
//   reduce_scatter()  each bucket's gradients summed over the group into this rank's
//                     chunk of the bucket itself (an in-place reduce-scatter instead
//                     of the all-reduce); or, armed
//                     by start_overlapped_reduce_scatter() before the last backward,
//                     each bucket's non-blocking reduce-scatter started from inside
//                     backward as soon as its gradients are final (GradBuffer's hooks),
//                     reduce_scatter() then waiting for them
//   local_norm_sq()   Σ g² over the chunk (the caller adds the group's up; clip() scales)
//   step()            AdamW (train/adamw.h: the same update, element for element) on
//                     the chunk's segments, in place in the parameters; then every
//                     bucket's updated values are all-gathered, so that every rank
//                     holds the whole parameters again (through the spent gradient
//                     buffer: after a step .grad() holds parameter values, until the
//                     next step zeroes it)
// Checkpoints store whole tensors; each rank writes and reads its own chunks of them
// (moment_pieces()).
// Owned by the Trainer; `grads` must outlive it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "core/named_tensor.h"
#include "io/tensor_pieces.h"
#include "train/adamw.h"
#include "train/grad_buffer.h"

namespace slimpi {

class Comm;

class DistributedAdamW {
 public:
  // group: the ranks that reduce `grads` (null or one rank: no sharding, the same
  // arithmetic). The buffer's buckets must be padded to multiples of its size.
  DistributedAdamW(GradBuffer& grads, Comm* group, const AdamWOptions& options);

  void start_overlapped_reduce_scatter();  // no-op without a group
  void reduce_scatter();  // collective over the group
  double local_norm_sq() const;
  void clip(double norm, double max_norm);
  // Step t (≥ 1) at learning rate lr; collective over the group.
  void step(double lr, int64_t t);

  // This rank's chunks of the moments as pieces of "exp_avg/<name>" and
  // "exp_avg_sq/<name>" (io/tensor_pieces.h: a parameter's shape, the segment's first
  // element in it), their values views of the moment buffers: a checkpoint writes them,
  // and reading into them loads the state.
  std::vector<TensorPiece> moment_pieces() const;
  // The tensors moment_pieces() are parts of, as fp32 meta tensors (shapes and dtypes,
  // no storage): what a checkpoint declares.
  std::vector<NamedTensor> state_like() const;

  int64_t n_local() const { return n_local_; }  // elements of this rank's chunks

 private:
  struct Segment {
    size_t param;            // index in grads.params()
    size_t bucket;
    int64_t param_offset;    // first element within the parameter
    int64_t length;
    int64_t local_offset;    // position in this rank's moment buffers
  };
  // bucket b's chunk length, and this rank's chunk of it in the gradient buffer
  int64_t chunk(size_t b) const { return buckets_[b].numel / size_; }
  at::Tensor own_chunk(size_t b) const;              // [chunk(b)] fp32, a view of the buffer
  at::Tensor segment_grad(const Segment& s) const;  // [s.length], a view of own_chunk(s.bucket)

  GradBuffer& grads_;
  Comm* group_;
  AdamWOptions options_;
  int rank_ = 0, size_ = 1;
  std::vector<GradBuffer::Range> buckets_;
  std::vector<int64_t> local_offsets_;  // per bucket
  int64_t n_local_ = 0;
  std::vector<Segment> segments_;
  at::Tensor exp_avg_, exp_avg_sq_;  // [n_local] fp32
};

}  // namespace slimpi
