// GradBuffer — every parameter's gradient as a view into one flat fp32 buffer,
// allocated once (docs/architecture.md: communication buffers are re-used, never re-made).
// Backward accumulates into the views in place; the buffer is summed over the
// data-parallel Comm in buckets; the global norm and clipping work on it.
//
// Buckets are runs of whole parameters, about bucket_bytes each, numbered in
// parameter order. Backward produces gradients roughly from the last parameter to the
// first, so buckets are reduced from the last to the first, the same order on every
// rank (non-blocking collectives must be started in one order everywhere).
// Overlap (Megatron's overlap_grad_reduce): start_overlapped_reduction() arms a
// post-accumulate-grad hook on every parameter before the last backward of a step;
// when a bucket's last parameter is accumulated, it and every later-numbered ready
// bucket not yet started go out as non-blocking allreduces while backward goes on.
// all_reduce() then starts what backward did not reach (parameters with no gradient
// this step) and waits for all. Without overlap, all_reduce() reduces the buckets one
// by one in the same order. Blocking and non-blocking collectives do not match, so
// every rank must take the same path: a rank with no backward in the step arms too. The sums are the same either way: each element is summed
// over the same ranks.
// With the distributed optimizer (train/distributed_optimizer.h) every bucket is padded
// with zeros to a multiple of the data-parallel size, so that it splits into equal
// chunks, one per rank, and the overlapped reduction is a non-blocking reduce-scatter
// of each bucket into the optimizer's chunk of it (Megatron's overlap_grad_reduce with
// the distributed optimizer): finish_reduction() waits for them.
// Owned by the Trainer. Invariant: p.grad() of every parameter aliases the buffer.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "model/transformer.h"
#include "parallel/comm.h"

namespace slimpi {

// Σ x² of a float tensor, accumulated in fp64 a piece of 2^20 elements at a time. Each
// square of an fp32 value is exact in fp64 (24-bit mantissas, 48-bit product), so the
// result is within n·2^-53 relative of the exact sum whatever the order or the CPU:
// gradient norms agree across layouts that split the same elements differently. ATen's
// fp32 norm accumulates in fp32 lanes: 0.3% low at 8M elements, 2.3% at 64M on the
// Xeon of 2026-12-05, and a different error for every split of the buffer.
double sum_of_squares_fp64(const at::Tensor& x);

class GradBuffer {
 public:
  // pad_buckets_to: every bucket's length is rounded up to a multiple of it.
  GradBuffer(const std::vector<NamedTensor>& params, int64_t bucket_bytes, int64_t pad_buckets_to = 1);
  ~GradBuffer();
  GradBuffer(const GradBuffer&) = delete;
  GradBuffer& operator=(const GradBuffer&) = delete;

  // Zeroes the buffer and re-points every p.grad() at its view.
  void zero();
  // Arms the hooks: the next backward starts each bucket's reduction over `comm` as soon
  // as its gradients are final. Call before the last backward of a step. No-op for a
  // null or one-rank comm. scatter_into (one tensor per bucket, numel / comm size fp32
  // elements each): each bucket is reduce-scattered into its tensor instead of summed
  // in place.
  void start_overlapped_reduction(Comm* comm, std::vector<at::Tensor> scatter_into = {});
  // Sums the buffer over `comm`: finishes an overlapped reduction, or reduces every
  // bucket now. No-op for a null or one-rank comm.
  void all_reduce(Comm* comm);
  // Waits for every bucket of the armed reduction (all_reduce's first half; the
  // distributed optimizer's reduce-scatter). Returns false when none was armed.
  bool finish_reduction(Comm* comm);
  // L2 norm of all gradients, summed in fp64 (sum_of_squares_fp64).
  double global_norm() const;
  // Scales gradients by max_norm / (norm + 1e-6) when norm > max_norm (> 0).
  void clip(double norm, double max_norm);

  const at::Tensor& flat() const { return flat_; }
  const std::vector<NamedTensor>& params() const { return params_; }
  // Where each parameter's gradient sits in flat() (in parameter order), and each
  // bucket's range (padding included).
  struct Range {
    int64_t offset = 0, numel = 0;
  };
  const std::vector<Range>& param_ranges() const { return param_ranges_; }
  std::vector<Range> bucket_ranges() const;
  int64_t n_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  bool reduction_armed() const { return armed_ != nullptr; }
  // Buckets started from inside backward by the last overlapped reduction (tests).
  int64_t n_started_in_backward() const { return started_in_backward_; }
  // Whether every p.grad() still aliases the buffer (tests; autograd could replace it).
  bool grads_alias_buffer() const;

 private:
  struct Bucket {
    int64_t offset = 0, numel = 0;  // range of flat_
    int64_t n_params = 0;           // parameters in it
    int64_t n_ready = 0;            // of them accumulated in the armed backward
    std::unique_ptr<PendingCollective> pending;
  };
  class Hook;
  void on_accumulated(size_t param_index);  // from the hook
  void start_ready_buckets(bool all);
  void start(Bucket& bucket);

  std::vector<NamedTensor> params_;
  at::Tensor flat_;  // [total parameter elements] fp32
  std::vector<at::Tensor> views_;
  std::vector<Range> param_ranges_;
  std::vector<int64_t> bucket_of_;  // per parameter
  std::vector<Bucket> buckets_;
  Comm* armed_ = nullptr;           // the comm of the overlapped reduction in progress
  std::vector<at::Tensor> scatter_into_;  // per bucket, while armed: reduce-scatter targets (empty: all-reduce)
  int64_t next_to_start_ = -1;      // buckets start from the last down to 0
  int64_t started_in_backward_ = 0;
};

}  // namespace slimpi
