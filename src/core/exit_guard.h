// run_guarded(): how an SPMD job ends on an error (DESIGN.md §6).
//   * an error every rank raises identically (slimpi::Error with collective() set,
//     e.g. a bad deck): rank 0 prints it once; every rank returns 1 and finalises MPI.
//   * any other exception is one rank's: it is printed with the rank's number and where
//     it was raised, and MPI_Abort ends every rank (no rank is left waiting).
#pragma once

#include <functional>

namespace slimpi {

// Runs `body` and returns its exit code, or 1 after a collective error.
int run_guarded(const std::function<int()>& body);

}  // namespace slimpi
