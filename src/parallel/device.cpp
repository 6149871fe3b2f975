#include "parallel/device.h"

#include <slimpi/build_info.h>
#include <slimpi/error.h>

#include "parallel/mpi_comm.h"
#include "parallel/watchdog.h"
#include "core/gpu_info.h"
#if SLIMPI_HAVE_NCCL
#include "parallel/nccl_comm.h"
#endif

namespace slimpi {

int local_gpu_count() { return static_cast<int>(visible_gpus().size()); }

bool nccl_compiled() { return SLIMPI_HAVE_NCCL; }

DeviceChoice choose_device(MPI_Comm world, const std::string& device, const std::string& backend,
                           int local_rank) {
  int gpus = local_gpu_count();
  int min_gpus = 0;
  {
    static const std::string context = "[start-up] GPUs per rank";
    WaitGuard guard({&context, "MPI_Allreduce", 1, "i32"});
    MPI_Allreduce(&gpus, &min_gpus, 1, MPI_INT, MPI_MIN, world);
  }

  DeviceChoice c;
  if (device == "cuda" && min_gpus == 0)
    SLIMPI_FAIL_ALL("run.device = \"cuda\" but {}: use run.device = \"auto\" or \"cpu\"",
                    cuda_compiled() ? "at least one rank sees no GPU"
                                    : "this slimpi was built against a LibTorch without CUDA");
  c.use_cuda = device == "cuda" || (device == "auto" && min_gpus > 0);
  if (c.use_cuda) c.gpu = local_rank % min_gpus;

  if (backend == "nccl" && !(c.use_cuda && nccl_compiled()))
    SLIMPI_FAIL_ALL("parallel.comm_backend = \"nccl\" needs CUDA tensors on every rank (run.device "
                    "resolved to {}{}): use parallel.comm_backend = \"auto\" or \"mpi\"",
                    c.use_cuda ? "cuda" : "cpu", nccl_compiled() ? "" : ", and this build has no NCCL");
  c.use_nccl = backend == "nccl" || (backend == "auto" && c.use_cuda && nccl_compiled());
  c.reason = fmt::format("device {} ({} GPU(s) on the poorest rank), collectives {}",
                         c.use_cuda ? fmt::format("cuda:{}", c.gpu) : "cpu", min_gpus,
                         c.use_nccl ? "nccl" : "mpi");
  return c;
}

std::unique_ptr<Comm> make_comm(MPI_Comm comm, const std::string& name, const DeviceChoice& choice) {
  if (comm == MPI_COMM_NULL) return nullptr;
#if SLIMPI_HAVE_NCCL
  if (choice.use_nccl) return std::make_unique<NcclComm>(comm, name, choice.gpu);
#endif
  return std::make_unique<MpiComm>(comm, name);
}

}  // namespace slimpi
