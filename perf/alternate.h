// A/B timing for benchmarks that report a ratio measured in one run: each iteration
// times both sides, alternating which goes first (so drift and warm caches favour
// neither), sets the iteration's manual time to side A's, and sums both.
#pragma once

#include <benchmark/benchmark.h>

#include <chrono>

namespace slimpi::perf {

// Seconds one call of fn takes on a steady clock: the `timed` argument of alternate()
// for one process (bench_comm passes the slowest rank's time instead).
inline constexpr auto wall_seconds = [](auto fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
};

struct AbSeconds {
  double a = 0, b = 0;  // summed over the iterations
};

// timed(fn) -> seconds one call of fn took (a plain clock, or the slowest rank's).
template <class Timed, class A, class B>
AbSeconds alternate(benchmark::State& state, Timed timed, A side_a, B side_b) {
  AbSeconds total;
  int64_t i = 0;
  for (auto _ : state) {
    double a, b;
    if (i++ % 2 == 0) {
      a = timed(side_a);
      b = timed(side_b);
    } else {
      b = timed(side_b);
      a = timed(side_a);
    }
    state.SetIterationTime(a);
    total.a += a;
    total.b += b;
  }
  return total;
}

}  // namespace slimpi::perf
