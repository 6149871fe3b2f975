// main() for the single-process benchmarks (bench_train, bench_engine): slimpi's
// allocator settings (docs/architecture.md, threads and memory), $SLIMPI_THREADS torch threads (default 1), then
// Google Benchmark.
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <cstdlib>

int main(int argc, char** argv) {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  const char* threads = std::getenv("SLIMPI_THREADS");
  at::set_num_threads(threads ? std::atoi(threads) : 1);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
