// Runtime settings of a rank that decide its speed: torch/OpenMP threads, the BLAS
// library actually loaded, the OpenMP wait policy. Printed at start (DESIGN.md §7).
#pragma once

#include <mpi.h>

#include <string>

namespace slimpi {

struct RuntimeSettings {
  int threads = 1;          // torch intra-op threads of this rank
  int local_rank = 0;       // rank among the ranks on this node
  int local_ranks = 1;      // ranks on this node
  int cores = 1;            // cores visible on this node
  std::string blas;         // resolved path of the loaded BLAS library
  std::string omp_wait_policy;
  std::string describe() const;
};

// Sets torch's thread count: `threads`, or cores / ranks-on-the-node when 0 (at least 1).
// Collective over `world` (finds the ranks that share a node). Warns (rank 0) when the
// reference BLAS is loaded or ranks x threads exceeds the cores.
RuntimeSettings apply_runtime_settings(MPI_Comm world, int64_t threads);

// Path of the loaded libblas/libopenblas (symlinks resolved), or "" when none is loaded.
std::string loaded_blas_library();

}  // namespace slimpi
