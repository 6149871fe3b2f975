// Torch-tensor and byte-string front end of Comm (parallel/comm.h).
//
// Tensors are reduced/broadcast in place and must be contiguous (no hidden copies of
// big buffers: gradient and weight buckets are flat tensors allocated once). A tensor
// on the wrong side of the backend (CUDA tensor on MPI, CPU tensor on NCCL) is staged
// through a copy on the other device and copied back: correct, but slower, and meant
// for small control data only. Byte strings travel the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace at {
class Tensor;
}

namespace slimpi {

DType dtype_of(const at::Tensor& t);

void allreduce(Comm& comm, const at::Tensor& t, ReduceOp op = ReduceOp::Sum);
void broadcast(Comm& comm, const at::Tensor& t, int root);
// Returns [comm.size(), *t.sizes()]: every rank's tensor, stacked in rank order.
at::Tensor allgather(Comm& comm, const at::Tensor& t);
// The same on rank 0 alone (point to point: no rank but rank 0 holds more than its own
// tensor); an undefined tensor on every other rank.
at::Tensor gather_to_first(Comm& comm, const at::Tensor& t);
// t [size · n, ...] -> [n, ...]: block rank() of the sum over ranks (t's dim 0 splits
// into comm.size() equal blocks).
at::Tensor reduce_scatter(Comm& comm, const at::Tensor& t);
// Rows (along dim 0) to and from every rank: send = blocks of send_rows[p] rows for each
// rank p in rank order; returns [Σ recv_rows, *t.shape[1:]], the blocks received from each
// rank in rank order. The row counts must agree pairwise (the caller exchanged them).
at::Tensor alltoallv_rows(Comm& comm, const at::Tensor& send, const std::vector<int64_t>& send_rows,
                          const std::vector<int64_t>& recv_rows);
void send(Comm& comm, const at::Tensor& t, int peer);
void recv(Comm& comm, const at::Tensor& t, int peer);

void broadcast_bytes(Comm& comm, std::string& bytes, int root);
void send_bytes(Comm& comm, const std::string& bytes, int peer);
std::string recv_bytes(Comm& comm, int peer);

}  // namespace slimpi
