// Watchdog — turns a silent hang in a blocking wait into a job abort that names it.
//
// Role: every blocking collective or receive holds a WaitGuard naming the operation,
// the communicator and its ranks (WaitInfo). A background thread, started once by main with the
// deck's parallel.timeout_s, checks the guard in flight; past the limit it prints the
// operation and how long it waited, and ends the process (_Exit(3): MPI runs
// FUNNELED, so this thread may not call MPI_Abort); the launcher then ends every rank,
// so no rank hangs forever.
// A wait on a file (WaitInfo::file) is also ended once it has lasted kFullDiskWait_s
// while that file's file system is out of space (core/file_write.h), naming the file.
// Before start() (and in tests that never start it) guards cost one mutex and nothing
// else. One wait is watched at a time: slimpi ranks issue collectives from one thread.
#pragma once

#include <string>

namespace slimpi {

// What a blocking wait is, kept as pointers and numbers so that marking a wait costs
// no formatting; the text is made only if the watchdog fires. `context` (e.g. "[rank
// 0 of comm 'trainer' (2 ranks, mpi)]") and `detail` must outlive the wait.
struct WaitInfo {
  const std::string* context = nullptr;
  const char* op = "";
  size_t count = 0;          // elements, 0 = not shown
  const char* dtype = "";
  int peer = -1;             // send/recv peer, -1 = none
  // A file the wait reads or writes, or nullptr. A wait on a file whose file system is
  // out of space is ended after a few seconds, not parallel.timeout_s: a write that
  // failed on one rank can leave the others inside HDF5's collective calls for good.
  const std::string* file = nullptr;
  std::string describe() const;
};

constexpr double kFullDiskWait_s = 3.0;

class Watchdog {
 public:
  static Watchdog& instance();
  void start(double timeout_s);
  void stop();
  double timeout_s() const;

  // Used by WaitGuard.
  void begin_wait(const WaitInfo& info);
  void end_wait();

 private:
  Watchdog() = default;
  ~Watchdog();
};

// RAII marker of a blocking wait: `WaitGuard g({&context_, "allreduce", n, "f32"});`
class WaitGuard {
 public:
  explicit WaitGuard(const WaitInfo& info) { Watchdog::instance().begin_wait(info); }
  ~WaitGuard() { Watchdog::instance().end_wait(); }
  WaitGuard(const WaitGuard&) = delete;
  WaitGuard& operator=(const WaitGuard&) = delete;
};

}  // namespace slimpi
