// A small MPI program that fails on purpose, run by tests/regression/failure_modes.sh.
// In the wait modes rank 1 blocks in one kind of wait while rank 0 sleeps outside MPI,
// so exactly one watchdog (2 s) can fire, whatever the machine's load:
//   failure_modes hang        a receive nobody sends (Comm point-to-point)
//   failure_modes allreduce   a Comm collective the other rank never joins
//   failure_modes bcast       a raw MPI broadcast (broadcast_string)
//   failure_modes idle        the driver's idle barrier
//   failure_modes h5          a collective append to a parallel HDF5 dataset
// The watchdog must end the job naming the operation. And:
//   failure_modes throw       rank 1 alone throws: the job must abort with rank 1's message
//   failure_modes collective  every rank throws the same collective error: one message,
//                             exit 1 everywhere, no abort
#include <mpi.h>
#include <slimpi/error.h>
#include <unistd.h>

#include <string>

#include "core/exit_guard.h"
#include "core/log.h"
#include "io/appendable_dataset.h"
#include "parallel/mpi_bytes.h"
#include "parallel/mpi_comm.h"
#include "parallel/watchdog.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  slimpi::log::init(rank, size);
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool wait_mode = mode == "hang" || mode == "allreduce" || mode == "bcast" || mode == "idle" || mode == "h5";
  slimpi::Watchdog::instance().start(2.0);
  int code = slimpi::run_guarded([&] {
    slimpi::MpiComm comm(MPI_COMM_WORLD, "trainer");
    if (wait_mode && rank == 0) {
      sleep(120);  // outside MPI: never watched; the launcher ends it
      return 0;
    }
    if (mode == "hang" && rank == 1) {
      float x = 0;
      comm.recv(&x, 1, slimpi::DType::F32, 0);  // never sent
    }
    if (mode == "allreduce") {
      float x = 1;
      comm.allreduce(&x, 1, slimpi::DType::F32, slimpi::ReduceOp::Sum);
    }
    if (mode == "bcast") {
      std::string text;
      slimpi::broadcast_string(MPI_COMM_WORLD, text, 0);
    }
    if (mode == "idle") slimpi::idle_barrier(MPI_COMM_WORLD, "[test] idle barrier nobody else reaches");
    if (mode == "h5") slimpi::h5::plan_appends(MPI_COMM_WORLD, {{1}});  // the count exchange of an append
    if (mode == "throw" && rank == 1) SLIMPI_FAIL("rank-local failure on purpose");
    if (mode == "collective") SLIMPI_FAIL_ALL("the same failure on every rank");
    comm.barrier();
    return 0;
  });
  slimpi::Watchdog::instance().stop();
  MPI_Finalize();
  return code;
}
