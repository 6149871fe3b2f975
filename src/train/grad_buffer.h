// GradBuffer — every parameter's gradient as a view into one flat fp32 buffer,
// allocated once (DESIGN.md §1: communication buffers are re-used, never re-made).
// Backward accumulates into the views in place; all_reduce() sums the buffer over the
// data-parallel Comm in fixed-size buckets; the global norm and clipping work on it.
// Owned by the Trainer. Invariant: p.grad() of every parameter aliases the buffer.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "model/transformer.h"
#include "parallel/comm.h"

namespace slimpi {

class GradBuffer {
 public:
  GradBuffer(const std::vector<NamedTensor>& params, int64_t bucket_bytes);

  // Zeroes the buffer and re-points every p.grad() at its view.
  void zero();
  // Sums the buffer over `comm` (bucket by bucket). No-op for a null comm.
  void all_reduce(Comm* comm);
  // L2 norm of all gradients.
  double global_norm() const;
  // Scales gradients by max_norm / (norm + 1e-6) when norm > max_norm (> 0).
  void clip(double norm, double max_norm);

  const at::Tensor& flat() const { return flat_; }
  int64_t n_buckets() const;
  // Whether every p.grad() still aliases the buffer (tests; autograd could replace it).
  bool grads_alias_buffer() const;

 private:
  std::vector<NamedTensor> params_;
  at::Tensor flat_;  // [total parameter elements] fp32
  std::vector<at::Tensor> views_;
  int64_t bucket_elems_;
};

}  // namespace slimpi
