#include "core/exit_guard.h"

#include <mpi.h>
#include <slimpi/error.h>

#include <iostream>

#include "core/log.h"

namespace slimpi {

int run_guarded(const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    if (e.collective()) {
      if (log::is_root()) std::cerr << "slimpi: error: " << e.what() << std::endl;
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
