// Megatron-LM's tensor-parallel mappings (megatron/core/tensor_parallel/mappings.py) as
// autograd functions over a Comm: the forward/backward pairs that column- and
// row-parallel layers, the vocab-parallel embedding and sequence parallelism are built
// from. Each is collective over `comm` in forward and in backward: every rank of the
// group calls it, and runs its backward, in the same order.
//
//   function                        forward                         backward
//   copy_to_tp                      identity                        all-reduce (sum)
//   reduce_from_tp                  all-reduce (sum)                identity
//   scatter_to_tp                   own slice of the last dim       all-gather, last dim
//   gather_from_tp                  all-gather, last dim            own slice of the last dim
//   scatter_to_sequence             own slice of dim 0              all-gather, dim 0
//   gather_from_sequence            all-gather, dim 0               reduce-scatter, dim 0
//   reduce_scatter_to_sequence      reduce-scatter, dim 0           all-gather, dim 0
//   gather_from_sequence_for_replicated
//                                   all-gather, dim 0               own slice of dim 0
// (the last: Megatron's gather_from_sequence_parallel_region with
// tensor_parallel_output_grad = False, for a block every rank runs whole on every token,
// whose gradients are then complete, not parts, on every rank).
//
// "Own slice": rank r of t keeps elements [r · n/t, (r + 1) · n/t) (n % t == 0, checked).
// A one-rank comm (or a null one) makes every function the identity. Under exact
// numerics (kernels/batch_invariant.h) a sum over the group is an all-gather and the
// ranks' parts added in rank order (a reduce-scatter keeps its own slice of that), so a
// trainer's group and an engine's of the same size add the same numbers alike.
#pragma once

#include <ATen/core/Tensor.h>

namespace slimpi {

class Comm;

at::Tensor copy_to_tp(Comm* comm, const at::Tensor& x);
at::Tensor reduce_from_tp(Comm* comm, const at::Tensor& x);
at::Tensor scatter_to_tp(Comm* comm, const at::Tensor& x);
at::Tensor gather_from_tp(Comm* comm, const at::Tensor& x);
at::Tensor scatter_to_sequence(Comm* comm, const at::Tensor& x);
at::Tensor gather_from_sequence(Comm* comm, const at::Tensor& x);
at::Tensor reduce_scatter_to_sequence(Comm* comm, const at::Tensor& x);
at::Tensor gather_from_sequence_for_replicated(Comm* comm, const at::Tensor& x);

}  // namespace slimpi
