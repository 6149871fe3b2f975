// Small MPI helpers for byte strings and error checking, used by every MPI caller.
#pragma once

#include <mpi.h>

#include <string>

namespace slimpi {

// Throws slimpi::Error with MPI's error text when `code` is not MPI_SUCCESS.
void check_mpi(int code, const char* what);

// Broadcasts a string of any length from `root` (length first, then the bytes).
void broadcast_string(MPI_Comm comm, std::string& text, int root);

}  // namespace slimpi
