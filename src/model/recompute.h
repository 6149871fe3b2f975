// Activation recomputation (Megatron's activation checkpointing; PyTorch's reentrant
// torch.utils.checkpoint): a block runs in forward without autograd keeping any of its
// intermediate tensors, only its inputs; backward runs it again with autograd on and
// back-propagates the outputs' gradients through that second run (into the inputs and
// into every parameter the block uses). Same gradients as without, at the cost of a
// second forward of the block; memory: the block's inputs instead of its activations.
// The block must compute the same values both times (no randomness; autocast as in the
// forward is restored for the second run), and a block with collectives inside
// (tensor parallelism) runs them again in backward, in backward's order, which is the
// same on every rank of the group.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace slimpi {

using RecomputedBlock = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

// block(inputs), its activations recomputed in backward. Inputs and outputs: float
// tensors (an input not requiring grad gets none).
std::vector<at::Tensor> recomputed(RecomputedBlock block, const std::vector<at::Tensor>& inputs);

// value(inputs) in forward; backward runs gradient(inputs) with autograd and
// back-propagates through it: the values of one computation with the gradients of
// another that computes the same function (exact numerics' kernels have no autograd
// formulas of their own: model/exact_ops.h). With no input requiring a gradient (or
// autograd off) it is value(inputs) without autograd.
std::vector<at::Tensor> value_with_gradient_of(RecomputedBlock value, RecomputedBlock gradient,
                                               const std::vector<at::Tensor>& inputs);

}  // namespace slimpi
