// run_guarded(): how an SPMD job ends on an error (docs/architecture.md, conventions).
//   * an error every rank raises identically (slimpi::Error with collective() set,
//     e.g. a bad deck): rank 0 prints it once; every rank returns 1 and finalises MPI.
//   * any other exception is one rank's: it is printed with the rank's number and where
//     it was raised, and MPI_Abort ends every rank (no rank is left waiting).
#pragma once

#include <functional>

namespace slimpi {

// Runs `body` and returns its exit code, or 1 after a collective error.
int run_guarded(const std::function<int()>& body);

// For code that holds objects whose destructors are collective (HDF5 files, MPI
// communicators): runs `body`, and on an error that is not collective aborts the job
// right here, before unwinding would run those destructors on this rank alone and
// leave it waiting for ranks that never come. Collective errors propagate.
void abort_on_local_error(const std::function<void()>& body);

}  // namespace slimpi
