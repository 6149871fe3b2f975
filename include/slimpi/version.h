// slimpi's version and the options it was built with (see `slimpi --version`).
#pragma once

#include <string>

namespace slimpi {

// "0.1.0"
std::string version();
// Multi-line description of compiler, build type, linker, LibTorch, HDF5, MPI, whether
// CUDA and NCCL are compiled in, and the GPUs this process sees.
std::string build_description();

}  // namespace slimpi
