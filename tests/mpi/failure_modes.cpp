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
//   failure_modes child_watchdog FILE  rank 1 starts a command (core/child_process.h) that
//                             writes its pid and that of a child of its own to FILE and
//                             sleeps, then hangs: the watchdog's _Exit ends it
//   failure_modes child_abort FILE     the same, then rank 1 throws: MPI_Abort ends it
//   (the script then checks that neither process of the command outlived the job)
#include <mpi.h>
#include <slimpi/error.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "core/child_process.h"
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
  const bool child_mode = mode == "child_watchdog" || mode == "child_abort";
  const bool wait_mode = child_mode || mode == "hang" || mode == "allreduce" || mode == "bcast" || mode == "idle" || mode == "h5";
  slimpi::Watchdog::instance().start(2.0);
  int code = slimpi::run_guarded([&] {
    slimpi::MpiComm comm(MPI_COMM_WORLD, "trainer");
    if (wait_mode && rank == 0) {
      sleep(120);  // outside MPI: never watched; the launcher ends it
      return 0;
    }
    std::unique_ptr<slimpi::ChildProcess> child;
    if (child_mode && rank == 1) {
      const std::string file = argc > 2 ? argv[2] : "/dev/null";
      child = std::make_unique<slimpi::ChildProcess>("sleep 1001 & echo $! >" + file + ".tmp; echo $$ >>" + file +
                                                     ".tmp; mv " + file + ".tmp " + file + "; exec sleep 1000");
      while (access(file.c_str(), F_OK) != 0) usleep(10000);  // both processes are running
    }
    if (mode == "child_abort" && rank == 1) {
      child.release();  // no destructor kills it: only the rank's death may (MPI_Abort below)
      SLIMPI_FAIL("rank-local failure with a command running");
    }
    if ((mode == "hang" || mode == "child_watchdog") && rank == 1) {
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
