// Stopwatch — wall-clock seconds since construction or the last restart(), less any
// time excluded with exclude() (a pause that should not count).
#pragma once

#include <chrono>

namespace slimpi {

class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  void restart() { start_ = Clock::now(); }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  void exclude(double s) {
    start_ += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
};

}  // namespace slimpi
