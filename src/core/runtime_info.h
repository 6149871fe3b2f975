// Runtime settings of a rank that decide its speed: torch/OpenMP threads, the OpenMP
// runtime(s) actually loaded, the BLAS torch was built with, the OpenMP wait policy.
// Printed at start (docs/architecture.md, threads and memory).
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace slimpi {

struct RuntimeSettings {
  int threads = 1;          // torch intra-op threads of this rank
  int local_rank = 0;       // rank among the ranks on this node
  int local_ranks = 1;      // ranks on this node
  int cores = 1;            // cores visible on this node
  std::string blas;         // the BLAS torch was built with ("MKL", "OpenBLAS", ...)
  std::vector<std::string> openmp_runtimes;  // loaded libgomp/libiomp/libomp (one is right)
  std::string omp_wait_policy;
  std::string describe() const;
};

// Sets torch's thread count: `threads`, or cores / ranks-on-the-node when 0 (at least 1).
// Collective over `world` (finds the ranks that share a node). Warns (rank 0) when two
// OpenMP runtimes are loaded (two thread pools that fight) or ranks x threads exceeds
// the cores.
RuntimeSettings apply_runtime_settings(MPI_Comm world, int64_t threads);

// This process's resident memory now (VmRSS), in bytes; 0 where /proc is not there.
int64_t resident_bytes();

// Paths of the OpenMP runtimes loaded in this process (symlinks resolved, no duplicates).
std::vector<std::string> loaded_openmp_runtimes();

}  // namespace slimpi
