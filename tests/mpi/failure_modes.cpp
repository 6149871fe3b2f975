// A small MPI program that fails on purpose, run by tests/regression/failure_modes.sh:
//   failure_modes hang    rank 1 waits on a receive nobody sends; the watchdog (2 s)
//                         must abort the whole job, naming the operation
//   failure_modes throw   rank 1 alone throws: the job must abort with rank 1's message
//   failure_modes collective  every rank throws the same collective error: one message,
//                         exit 1 everywhere, no abort
#include <mpi.h>
#include <slimpi/error.h>

#include <string>

#include "core/exit_guard.h"
#include "core/log.h"
#include "parallel/mpi_comm.h"
#include "parallel/watchdog.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  slimpi::log::init(rank, size);
  const std::string mode = argc > 1 ? argv[1] : "";
  slimpi::Watchdog::instance().start(2.0);
  int code = slimpi::run_guarded([&] {
    slimpi::MpiComm comm(MPI_COMM_WORLD, "trainer");
    if (mode == "hang" && rank == 1) {
      float x = 0;
      comm.recv(&x, 1, slimpi::DType::F32, 0);  // never sent
    }
    if (mode == "throw" && rank == 1) SLIMPI_FAIL("rank-local failure on purpose");
    if (mode == "collective") SLIMPI_FAIL_ALL("the same failure on every rank");
    comm.barrier();
    return 0;
  });
  slimpi::Watchdog::instance().stop();
  MPI_Finalize();
  return code;
}
