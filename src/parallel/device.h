// Device detection and the choice of collective backend, agreed by all ranks.
//
// A GPU counts only when the CUDA runtime answers cudaGetDeviceCount with success and
// a count > 0 (without a driver it returns error 35 and leaves the count unwritten).
// Every decision is reduced with MPI (MIN over ranks) so that all ranks agree.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "parallel/comm.h"

namespace slimpi {

// GPUs visible to this process (0 without CUDA in LibTorch, or no driver).
int local_gpu_count();
// Whether the NCCL backend was compiled into this binary.
bool nccl_compiled();

struct DeviceChoice {
  bool use_cuda = false;   // tensors on the rank's GPU
  int gpu = -1;            // local GPU index when use_cuda
  bool use_nccl = false;   // collectives through NCCL
  std::string reason;      // one line for the start-up log
};

// Resolves run.device and parallel.comm_backend ("auto" | ...) on every rank of
// `world`; an impossible request (cuda without GPUs on some rank, nccl without CUDA) is
// a collective error naming the key. `local_rank` picks the GPU on a node.
DeviceChoice choose_device(MPI_Comm world, const std::string& device, const std::string& backend,
                           int local_rank);

// A Comm for `comm` on the chosen backend.
std::unique_ptr<Comm> make_comm(MPI_Comm comm, const std::string& name, const DeviceChoice& choice);

}  // namespace slimpi
