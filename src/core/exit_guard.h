// run_guarded(): how an SPMD job ends on an error (docs/architecture.md, conventions).
//   * an error every rank raises identically (slimpi::Error with collective() set,
//     e.g. a bad deck): rank 0 prints it once; every rank returns 1 and finalises MPI.
//   * any other exception is one rank's: it is printed with the rank's number and where
//     it was raised, and MPI_Abort ends every rank (no rank is left waiting).
#pragma once

#include <mpi.h>

#include <functional>

namespace slimpi {

class Error;

// Runs `body` and returns its exit code, or 1 after a collective error.
int run_guarded(const std::function<int()>& body);

// For code that holds objects whose destructors are collective (HDF5 files, MPI
// communicators): runs `body`, and on an error that is not collective aborts the job
// right here, before unwinding would run those destructors on this rank alone and
// leave it waiting for ranks that never come. Collective errors propagate.
void abort_on_local_error(const std::function<void()>& body);

// For an error that every rank of one side raised (collective over `side`, the trainer
// or the rollout communicator) while the other side's ranks wait for it in split
// placement: returning 1 on this side alone would leave the other side in its next
// wait until parallel.timeout_s. The side's first rank prints the message once and
// aborts the job (exit code 1); the side's other ranks give it `grace_s` to do so, then
// print it themselves and abort (the first rank may not have raised it). Never returns.
[[noreturn]] void end_job_for_side_error(const Error& e, MPI_Comm side, double grace_s = 30.0);

// Whether every rank of `comm` calls this within timeout_s: an MPI_Ibarrier tested with
// short sleeps. `comm` must serve nothing else (a rank that never comes leaves the
// barrier pending, and the job is then ended). Tells an error every rank of the world
// raised (the clean exit of run_guarded) from one only a side raised.
bool every_rank_arrives(MPI_Comm comm, double timeout_s);

}  // namespace slimpi
