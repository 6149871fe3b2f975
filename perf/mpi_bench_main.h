// Helpers for Google Benchmark programs run under mpirun.
//
// Every rank runs every benchmark with the same fixed iteration count (a benchmark
// whose count each rank chose alone would deadlock in its collectives). Times are
// manual: each iteration's time is the slowest rank's (MPI_MAX), which is what a
// collective costs the job. Only rank 0 reports. A benchmark may record its mean
// time under a name with record(); ratio lines "A vs B" are printed at the end.
#pragma once

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <string>

namespace slimpi::perf {

// Seconds `fn` took on the slowest rank (collective: every rank calls it).
template <class Fn>
double timed_max(Fn fn) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  fn();
  double mine = MPI_Wtime() - t0, slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

// Initialises MPI and Google Benchmark, runs every registered benchmark (reporting on
// rank 0 only), finalises MPI.
int run_mpi_benchmarks(int argc, char** argv);

}  // namespace slimpi::perf
