// Differentiable all-to-all of tensor rows over a Comm: the token exchange of expert
// parallelism (model/moe.h). Forward: alltoallv_rows (parallel/comm_tensor.h); backward:
// the same exchange with the row counts swapped, gradients travelling back to the rows
// they came from. Collective: every rank of the comm must call it, and (in training) run
// its backward, in the same order — a rank whose output would otherwise not reach the
// loss must still keep it in its graph (a zero-row block does).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace slimpi {

class Comm;

// x [Σ send_rows, ...] -> [Σ recv_rows, ...]; autograd through the exchange.
at::Tensor exchange_rows(Comm& comm, const at::Tensor& x, const std::vector<int64_t>& send_rows,
                         const std::vector<int64_t>& recv_rows);

}  // namespace slimpi
