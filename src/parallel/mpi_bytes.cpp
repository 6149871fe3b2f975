#include "parallel/mpi_bytes.h"

#include <slimpi/error.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>

#include "core/file_write.h"
#include "core/log.h"
#include "parallel/watchdog.h"

namespace slimpi {
namespace {

// Calls `ready` until it returns true, asleep between calls (50 us, doubling to 1 ms):
// a rank that waits leaves its core to the ranks that work, and hears within 1 ms.
template <class Ready>
void nap_until(Ready&& ready) {
  auto nap = std::chrono::microseconds(50);
  while (!ready()) {
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  SLIMPI_FAIL("{} failed: {}", what, std::string(text, len));
}

void broadcast_string(MPI_Comm comm, std::string& text, int root) {
  static const std::string context = "[broadcast of a byte string]";
  WaitGuard guard({&context, "MPI_Bcast", 0, "", root});
  uint64_t n = text.size();
  check_mpi(MPI_Bcast(&n, 1, MPI_UINT64_T, root, comm), "MPI_Bcast(length)");
  text.resize(n);
  // Large strings in chunks: MPI counts are int.
  const uint64_t chunk = uint64_t(1) << 30;
  for (uint64_t off = 0; off < n; off += chunk)
    check_mpi(MPI_Bcast(text.data() + off, static_cast<int>(std::min(chunk, n - off)), MPI_CHAR,
                        root, comm),
              "MPI_Bcast(bytes)");
}


int message_count(size_t n, int dest, int tag) {
  SLIMPI_CHECK(n <= size_t(std::numeric_limits<int>::max()), "a message of {} bytes to rank {} (tag {}) is over the "
               "2 GiB that one MPI message of bytes holds", n, dest, tag);
  return static_cast<int>(n);
}

void send_message(MPI_Comm comm, const std::string& bytes, int dest, int tag) {
  check_mpi(MPI_Send(bytes.data(), message_count(bytes.size(), dest, tag), MPI_BYTE, dest, tag, comm), "MPI_Send");
}

std::string recv_message(MPI_Comm comm, int source, int tag, const std::string& context) {
  MPI_Status status;
  int flag = 0;
  check_mpi(MPI_Iprobe(source, tag, comm, &flag, &status), "MPI_Iprobe");
  if (!flag) {
    // Not MPI_Probe: Open MPI's blocking probe polls its shared-memory transport on a
    // full core for as long as it waits, the core an engine or an agent next to it needs
    // (on 2 cores, 9.9% of all CPU samples of an agent run: perf/results/2026-12-07.md).
    WaitGuard guard({&context, "MPI_Iprobe (asleep between probes)", 0, "", source});
    nap_until([&] { return check_mpi(MPI_Iprobe(source, tag, comm, &flag, &status), "MPI_Iprobe"), flag != 0; });
  }
  int n = 0;
  MPI_Get_count(&status, MPI_BYTE, &n);
  std::string bytes(n, '\0');
  check_mpi(MPI_Recv(bytes.data(), n, MPI_BYTE, status.MPI_SOURCE, tag, comm, MPI_STATUS_IGNORE), "MPI_Recv");
  return bytes;
}

std::string int64_bytes(const std::vector<int64_t>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t));
}

std::vector<int64_t> int64_values(const std::string& bytes) {
  std::vector<int64_t> v(bytes.size() / sizeof(int64_t));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(int64_t));
  return v;
}

bool message_waiting(MPI_Comm comm, int source, int tag) {
  int flag = 0;
  check_mpi(MPI_Iprobe(source, tag, comm, &flag, MPI_STATUS_IGNORE), "MPI_Iprobe");
  return flag != 0;
}

void await_message(MPI_Comm comm, int source, int tag, const std::string& context) {
  await_any_message(comm, source, {tag}, context);
}

int await_any_message(MPI_Comm comm, int source, const std::vector<int>& tags, const std::string& context) {
  auto waiting = [&]() {
    for (int tag : tags)
      if (message_waiting(comm, source, tag)) return tag;
    return -1;
  };
  int tag = waiting();
  if (tag >= 0) return tag;
  WaitGuard guard({&context, "MPI_Iprobe (asleep between probes)", 0, "", source});
  nap_until([&] { return (tag = waiting()) >= 0; });
  return tag;
}

void idle_barrier(MPI_Comm comm, const std::string& what) {
  WaitGuard guard({&what, "idle barrier"});
  MPI_Request request;
  check_mpi(MPI_Ibarrier(comm, &request), "MPI_Ibarrier");
  int done = 0;
  for (int spin = 0; spin < 200 && !done; ++spin) MPI_Test(&request, &done, MPI_STATUS_IGNORE);
  if (!done) nap_until([&] { return check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test"), done != 0; });
}


void run_on_all_and_agree(MPI_Comm comm, const std::string& context, const std::function<void()>& body) {
  std::string problem;
  bool failed = false;
  try {
    body();
  } catch (const std::exception& e) {
    problem = e.what();
    failed = true;
  }
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  int mine = failed ? rank : INT32_MAX, first = INT32_MAX;
  {
    // Non-blocking, so that a failed rank whose peers never arrive (stuck inside a
    // collective library call after its failure, e.g. HDF5 on a full disk) still says
    // why before the watchdog ends the job.
    WaitGuard guard({&context, "(agreeing whether any rank failed)"});
    MPI_Request request;
    check_mpi(MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm, &request), "MPI_Iallreduce");
    const auto since = std::chrono::steady_clock::now();
    bool said = false;
    const bool out_of_space = reports_no_space(problem);
    for (int done = 0; !done;) {
      check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) break;
      const auto waited = std::chrono::steady_clock::now() - since;
      if (failed && !said && waited > std::chrono::seconds(2)) {
        log::error("{}: {} (waiting for the other ranks to hear of it)", context, problem);
        said = true;
      }
      // Out of space, the others may be held in a wait that knows no file (an HDF5
      // library call between two of ours): do not wait parallel.timeout_s for them.
      if (failed && out_of_space && waited > std::chrono::duration<double>(2 * kFullDiskWait_s)) {
        log::error("{}: the other ranks did not hear of it in {:.0f} s; aborting the job", context,
                   2 * kFullDiskWait_s);
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  if (first == INT32_MAX) return;
  broadcast_string(comm, problem, first);
  SLIMPI_FAIL_ALL("{} (rank {}): {}", context, first, problem);
}

}  // namespace slimpi
