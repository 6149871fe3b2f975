#include "parallel/tp_mappings.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/batch_invariant.h"
#include "parallel/comm.h"
#include "parallel/comm_tensor.h"

namespace slimpi {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The collectives the mappings are made of, on one tensor (any shape).
enum class Op { None, AllReduce, SliceLast, GatherLast, SliceFirst, GatherFirst, ReduceScatterFirst };

at::Tensor own_slice(Comm& comm, const at::Tensor& x, int64_t dim) {
  const int64_t n = x.size(dim), t = comm.size();
  SLIMPI_CHECK(n % t == 0, "tensor parallelism over {} ranks: dimension {} of size {} does not split evenly", t, dim, n);
  return x.narrow(dim, n / t * comm.rank(), n / t).contiguous();
}

// Σ_r all[r] in rank order: [t, ...] -> [...]. Exact numerics' sum (kernels/
// batch_invariant.h): the same additions in the trainer's group and the engine's, whatever
// algorithm MPI or NCCL would pick for the message's size.
at::Tensor sum_in_rank_order(const at::Tensor& all) {
  at::Tensor out = all[0].clone();
  for (int64_t r = 1; r < all.size(0); ++r) out.add_(all[r]);
  return out;
}

at::Tensor run(Op op, Comm& comm, const at::Tensor& x) {
  switch (op) {
    case Op::None: return x;
    case Op::AllReduce: {
      if (exact_numerics()) return sum_in_rank_order(allgather(comm, x.contiguous()));
      at::Tensor out = x.contiguous().clone();
      allreduce(comm, out);
      return out;
    }
    case Op::SliceLast: return own_slice(comm, x, x.dim() - 1);
    case Op::SliceFirst: return own_slice(comm, x, 0);
    case Op::GatherLast: {
      const at::Tensor all = allgather(comm, x.contiguous());  // [t, *x.shape]
      return at::cat(all.unbind(0), x.dim() - 1);
    }
    case Op::GatherFirst: {
      const at::Tensor all = allgather(comm, x.contiguous());  // [t, n, ...]
      std::vector<int64_t> shape = x.sizes().vec();
      shape[0] *= comm.size();
      return all.reshape(shape);
    }
    case Op::ReduceScatterFirst:
      if (exact_numerics()) return own_slice(comm, sum_in_rank_order(allgather(comm, x.contiguous())), 0);
      return reduce_scatter(comm, x.contiguous());
  }
  return x;
}

// One mapping: `Forward` in forward, `Backward` on the incoming gradient.
template <Op Forward, Op Backward>
struct Mapping : public torch::autograd::Function<Mapping<Forward, Backward>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Comm* comm) {
    ctx->saved_data["comm"] = reinterpret_cast<int64_t>(comm);
    return run(Forward, *comm, x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* comm = reinterpret_cast<Comm*>(ctx->saved_data["comm"].toInt());
    return {run(Backward, *comm, grads[0]), at::Tensor()};
  }
};

template <Op Forward, Op Backward>
at::Tensor apply(Comm* comm, const at::Tensor& x) {
  if (!comm || comm->size() == 1) return x;
  return Mapping<Forward, Backward>::apply(x, comm);
}

}  // namespace

at::Tensor copy_to_tp(Comm* comm, const at::Tensor& x) { return apply<Op::None, Op::AllReduce>(comm, x); }
at::Tensor reduce_from_tp(Comm* comm, const at::Tensor& x) { return apply<Op::AllReduce, Op::None>(comm, x); }
at::Tensor scatter_to_tp(Comm* comm, const at::Tensor& x) { return apply<Op::SliceLast, Op::GatherLast>(comm, x); }
at::Tensor gather_from_tp(Comm* comm, const at::Tensor& x) { return apply<Op::GatherLast, Op::SliceLast>(comm, x); }
at::Tensor scatter_to_sequence(Comm* comm, const at::Tensor& x) {
  return apply<Op::SliceFirst, Op::GatherFirst>(comm, x);
}
at::Tensor gather_from_sequence(Comm* comm, const at::Tensor& x) {
  return apply<Op::GatherFirst, Op::ReduceScatterFirst>(comm, x);
}
at::Tensor reduce_scatter_to_sequence(Comm* comm, const at::Tensor& x) {
  return apply<Op::ReduceScatterFirst, Op::GatherFirst>(comm, x);
}
at::Tensor gather_from_sequence_for_replicated(Comm* comm, const at::Tensor& x) {
  return apply<Op::GatherFirst, Op::SliceFirst>(comm, x);
}

}  // namespace slimpi
