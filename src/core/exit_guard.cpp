#include "core/exit_guard.h"

#include <mpi.h>
#include <slimpi/error.h>

#include <unistd.h>

#include <cstdio>
#include <string>

#include "core/log.h"

namespace slimpi {
namespace {

// One write(2) call: mpirun forwards stdout and stderr apart, and an error written in
// pieces had a log line land inside it ("slimpi: error: [time] run directory: ...").
void print_error_line(const std::string& what) {
  std::fflush(stdout);
  const std::string line = "slimpi: error: " + what + "\n";
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n <= 0) break;
    done += size_t(n);
  }
}

}  // namespace

int run_guarded(const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    if (e.collective()) {
      if (log::is_root()) print_error_line(e.what());
      return 1;
    }
    log::error("{}\n  (raised at {}; aborting every rank)", e.what(), e.where());
  } catch (const std::exception& e) {
    log::error("{} (aborting every rank)", e.what());
  }
  MPI_Abort(MPI_COMM_WORLD, 2);
  return 2;
}

void abort_on_local_error(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    if (e.collective()) throw;
    log::error("{}\n  (raised at {}; aborting every rank)", e.what(), e.where());
    MPI_Abort(MPI_COMM_WORLD, 2);
  } catch (const std::exception& e) {
    log::error("{} (aborting every rank)", e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
}

}  // namespace slimpi
