// slimpi's version and the options it was built with (see `slimpi --version`).
#pragma once

#include <string>

namespace slimpi {

// "0.1.0"
std::string version();
// Multi-line description of compiler, build type, linker, LibTorch, HDF5, MPI, Kokkos
// and whether the NCCL backend was compiled in.
std::string build_description();

}  // namespace slimpi
