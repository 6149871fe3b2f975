#include "core/exit_guard.h"

#include <mpi.h>
#include <slimpi/error.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
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

bool every_rank_arrives(MPI_Comm comm, double timeout_s) {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ibarrier(comm, &request);
  const double deadline = MPI_Wtime() + timeout_s;
  for (int done = 0;;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return true;
    if (MPI_Wtime() > deadline) return false;  // (the request stays pending: the caller ends the job)
    ::usleep(1000);
  }
}

void end_job_for_side_error(const Error& e, MPI_Comm side, double grace_s) {
  int rank = 0;
  MPI_Comm_rank(side, &rank);
  if (rank != 0) {  // sleep, not an MPI wait: the first rank's abort ends this process
    // (In steps: the launcher's SIGTERM, which the stop-signal handler catches, ends a
    // usleep early; the grace must still be the whole grace.)
    for (const double until = MPI_Wtime() + grace_s; MPI_Wtime() < until;) ::usleep(10000);
    log::error("{} (the first rank of this side did not end the job; aborting every rank)", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  print_error_line(e.what());
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return
}

}  // namespace slimpi
