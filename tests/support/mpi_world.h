// This process's rank in MPI_COMM_WORLD and the world's size: what the MPI tests ask
// to choose their part of a layout.
#pragma once

#include <mpi.h>

namespace slimpi::testing {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

}  // namespace slimpi::testing
