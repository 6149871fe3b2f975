// MpiComm — Comm over an MPI communicator, for host memory.
// Owns a duplicate of the communicator it was given (so its traffic never matches
// another component's) and the user-defined reduction for bf16 sums. iallreduce and
// ireduce_scatter are MPI_Iallreduce and MPI_Ireduce_scatter_block: they progress when
// MPI is called (test(), wait(), other calls). Large counts are sent in chunks of at
// most 2^30 elements (MPI counts are int).
#pragma once

#include <mpi.h>

#include "parallel/comm.h"

namespace slimpi {

class MpiComm final : public Comm {
 public:
  MpiComm(MPI_Comm comm, std::string name);
  ~MpiComm() override;

  const std::string& name() const override { return name_; }
  const char* backend() const override { return "mpi"; }
  bool device_memory() const override { return false; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm mpi_comm() const { return comm_; }

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
  // Whether `block` is this rank's block of `whole` (blocks of count elements): the
  // in-place forms of reduce_scatter (recv in send) and allgather (send in recv).
  bool in_place_block(const void* whole, const void* block, size_t count, DType dtype) const {
    return static_cast<const char*>(whole) + size_t(rank_) * count * dtype_size(dtype) ==
           static_cast<const char*>(block);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  std::string context_;  // "[rank r of comm 'name' (n ranks, backend)]", for the watchdog
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace slimpi
