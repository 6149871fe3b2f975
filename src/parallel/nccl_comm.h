// NcclComm — Comm over NCCL, for CUDA device memory. Compiled only when the CUDA
// toolkit and NCCL are found (SLIMPI_HAVE_NCCL); made only when every rank of the
// communicator has a GPU (see parallel/device.h).
// Owns the ncclComm_t (rank 0 makes the unique id, broadcast over the MPI communicator
// it is built from) and a 1-element device buffer for barrier().
// Ordering with compute: every operation is enqueued on torch's *current* CUDA stream
// of the comm's device, so it starts only after the kernels torch enqueued before it
// (backward's gradients, the optimizer's weights) and torch work enqueued after it
// sees its result; no second stream races the compute. Blocking operations then wait
// for that stream before returning, so the semantics match MpiComm: when a call
// returns, the buffer holds the result. iallreduce and ireduce_scatter return once enqueued.
#pragma once

#include <mpi.h>

#include <memory>

#include "parallel/comm.h"

namespace slimpi {

class NcclComm final : public Comm {
 public:
  NcclComm(MPI_Comm comm, std::string name, int device);
  ~NcclComm() override;

  const std::string& name() const override { return name_; }
  const char* backend() const override { return "nccl"; }
  bool device_memory() const override { return true; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce(void* data, size_t count, DType dtype, ReduceOp op) override;
  std::unique_ptr<PendingCollective> iallreduce(void* data, size_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* data, size_t count, DType dtype, int root) override;
  void allgather(const void* send, void* recv, size_t count, DType dtype) override;
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype) override;
  std::unique_ptr<PendingCollective> ireduce_scatter(const void* send, void* recv, size_t count,
                                                     DType dtype) override;
  void alltoallv(const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                 DType dtype) override;
  void send(const void* data, size_t count, DType dtype, int peer) override;
  void recv(void* data, size_t count, DType dtype, int peer) override;
  void barrier() override;

 private:
  struct Handles;  // NCCL/CUDA types stay out of this header
  void finish(const char* what);

  std::unique_ptr<Handles> h_;
  std::string name_;
  std::string context_;  // "[rank r of comm 'name' (n ranks, backend)]", for the watchdog
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace slimpi
