// Watchdog — turns a silent hang in a blocking wait into a job abort that names it.
//
// Role: every blocking collective or receive holds a WaitGuard naming the operation,
// the communicator and its ranks. A background thread, started once by main with the
// deck's parallel.timeout_s, checks the guard in flight; past the limit it prints the
// operation and how long it waited, and calls MPI_Abort so no rank hangs forever.
// Before start() (and in tests that never start it) guards cost one mutex and nothing
// else. One wait is watched at a time: slimpi ranks issue collectives from one thread.
#pragma once

#include <string>

namespace slimpi {

class Watchdog {
 public:
  static Watchdog& instance();
  void start(double timeout_s);
  void stop();
  double timeout_s() const;

  // Used by WaitGuard.
  void begin_wait(const std::string& what);
  void end_wait();

 private:
  Watchdog() = default;
  ~Watchdog();
};

// RAII marker of a blocking wait: `WaitGuard g("allreduce on comm 'trainer' ...");`
class WaitGuard {
 public:
  explicit WaitGuard(const std::string& what) { Watchdog::instance().begin_wait(what); }
  ~WaitGuard() { Watchdog::instance().end_wait(); }
  WaitGuard(const WaitGuard&) = delete;
  WaitGuard& operator=(const WaitGuard&) = delete;
};

}  // namespace slimpi
