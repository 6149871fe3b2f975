#include "mpi_bench_main.h"

#include <malloc.h>

#include <cstdio>

namespace slimpi::perf {

namespace {
class SilentReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};
}  // namespace

int run_mpi_benchmarks(int argc, char** argv) {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);  // as slimpi itself does (docs/architecture.md, threads and memory)
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  benchmark::Initialize(&argc, argv);
  if (rank == 0) {
    std::printf("ranks: %d\n", size);
    benchmark::RunSpecifiedBenchmarks();
  } else {
    SilentReporter silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
  benchmark::Shutdown();
  MPI_Finalize();
  return 0;
}

}  // namespace slimpi::perf
