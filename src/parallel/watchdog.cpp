#include "parallel/watchdog.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/file_write.h"
#include "core/log.h"

namespace slimpi {
namespace {

using Clock = std::chrono::steady_clock;

struct WatchState {
  std::mutex mutex;
  std::condition_variable wake;
  std::thread thread;
  bool running = false;
  double timeout_s = 0.0;
  bool waiting = false;
  WaitInfo what;
  Clock::time_point since;
};

WatchState& state() {
  static WatchState s;
  return s;
}

void watch_loop() {
  WatchState& s = state();
  std::unique_lock<std::mutex> lock(s.mutex);
  const auto poll = std::chrono::duration<double>(std::min(1.0, s.timeout_s / 4));
  while (s.running) {
    s.wake.wait_for(lock, poll);
    if (!s.running || !s.waiting) continue;
    double waited = std::chrono::duration<double>(Clock::now() - s.since).count();
    if (s.what.file && waited > std::min(kFullDiskWait_s, s.timeout_s)) {
      // (statvfs under the lock: the waiting thread only takes it to end its wait.)
      if (auto full = disk_space_problem(*s.what.file)) {
        log::error("{} has waited {:.0f} s on a file system that is out of space ({}): a write has most likely "
                   "failed on some rank, and the others cannot finish the collective call; ending the job (free "
                   "space, then run again: the job resumes from its last finished checkpoint)",
                   s.what.describe(), waited, *full);
        std::fflush(nullptr);
        std::_Exit(3);
      }
    }
    if (waited > s.timeout_s) {
      log::error("{} has waited {:.0f} s (parallel.timeout_s = {}): a peer rank is dead, stuck, not calling "
                 "it, or busy longer than that (a generation, a reward.command, a file write); ending the job",
                 s.what.describe(), waited, s.timeout_s);
      // MPI was initialised with MPI_THREAD_FUNNELED: this thread may not call MPI.
      // Exiting without MPI_Finalize makes the launcher (mpirun, srun) end every rank.
      std::fflush(nullptr);
      std::_Exit(3);
    }
  }
}

}  // namespace

std::string WaitInfo::describe() const {
  std::string text = fmt::format("{} {}", context ? *context : std::string("?"), op);
  if (count > 0) text += fmt::format(" of {} x {}", count, dtype);
  if (peer >= 0) text += fmt::format(" {} rank {}", std::string(op) == "send" ? "to" : "from", peer);
  return text;
}

Watchdog& Watchdog::instance() {
  static Watchdog w;
  return w;
}

Watchdog::~Watchdog() { stop(); }

void Watchdog::start(double timeout_s) {
  stop();
  WatchState& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.timeout_s = timeout_s;
    s.running = true;
  }
  s.thread = std::thread(watch_loop);
}

void Watchdog::stop() {
  WatchState& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.running) return;
    s.running = false;
  }
  s.wake.notify_all();
  if (s.thread.joinable()) s.thread.join();
}

double Watchdog::timeout_s() const { return state().timeout_s; }

void Watchdog::begin_wait(const WaitInfo& info) {
  WatchState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.waiting = true;
  s.what = info;
  s.since = Clock::now();
}

void Watchdog::end_wait() {
  WatchState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.waiting = false;
}

}  // namespace slimpi
