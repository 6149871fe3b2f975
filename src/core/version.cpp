#include <H5public.h>
#include <mpi.h>
#include <slimpi/build_info.h>
#include <slimpi/version.h>

#include "core/gpu_info.h"
#include <torch/csrc/api/include/torch/version.h>

#include <fmt/format.h>

namespace slimpi {

std::string version() { return SLIMPI_VERSION_STRING; }

std::string build_description() {
  char mpi_lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(mpi_lib, &len);
  std::string mpi(mpi_lib, len);
  mpi = mpi.substr(0, mpi.find_first_of(",\n"));
  return fmt::format(
      "slimpi {}\n"
      "  build:    {} with {}, linker {}\n"
      "  libtorch: {} (headers {})\n"
      "  hdf5:     {}.{}.{} (parallel)\n"
      "  mpi:      {}\n"
      "  cuda:     {}\n"
      "  nccl:     {}\n"
      "  gpus:     {}",
      version(), SLIMPI_BUILD_TYPE, SLIMPI_COMPILER, SLIMPI_LINKER, SLIMPI_TORCH_VERSION, TORCH_VERSION,
      H5_VERS_MAJOR, H5_VERS_MINOR, H5_VERS_RELEASE, mpi, cuda_description(),
      SLIMPI_HAVE_NCCL ? "compiled in (used when every rank has a GPU)" : "not compiled", gpus_description());
}

}  // namespace slimpi
