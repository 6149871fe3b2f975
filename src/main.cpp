// slimpi — one SPMD executable: `mpirun -np N slimpi run DECK.toml [--set key=value ...]`.
// Order of life: allocator settings -> MPI -> command line -> deck -> driver, then MPI
// is finalised. Errors every rank sees (a bad deck)
// are printed once and every rank exits 1; an error on one rank aborts the job.
#include <malloc.h>
#include <mpi.h>
#include <slimpi/version.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include "cli/commands.h"
#include "core/exit_guard.h"
#include "core/log.h"
#include "core/stop_signal.h"
#include "io/h5.h"
#include "parallel/watchdog.h"

int main(int argc, char** argv) {
  // glibc hands big frees back to the OS; re-faulting them costs 1.4-2x on torch steps
  // and 10x on large MPI buffers here (docs/architecture.md, threads and memory). Keep freed memory in the process.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);

  // `slimpi run` stops cleanly on SIGTERM/SIGUSR1 (core/stop_signal.h). Installed before
  // MPI starts: Slurm's --signal can arrive while the job is still starting up.
  if (argc > 1 && std::string(argv[1]) == "run") slimpi::install_stop_signal_handlers();

  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  slimpi::log::init(rank, size);

  int code = 0;
  {
    CLI::App app{"slimpi: RL post-training of language models as one MPI program", "slimpi"};
    app.set_version_flag("--version", [] { return slimpi::build_description(); });
    app.require_subcommand(1);
    slimpi::cli::Commands commands(app);
    bool parsed = false;
    try {
      app.parse(argc, argv);
      parsed = true;
    } catch (const CLI::ParseError& e) {
      // Every rank parses the same argv: print once, exit the same way everywhere.
      // --help and --version end here too (exit 0): they run nothing.
      if (rank == 0) code = app.exit(e);
      else code = e.get_exit_code();
      MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
    }
    if (parsed && !app.get_subcommands().empty())
      code = slimpi::run_guarded([&] { return commands.run_selected(); });
    slimpi::Watchdog::instance().stop();
  }
  if (slimpi::h5::library_damaged()) {
    // An HDF5 file failed to close (a full disk): HDF5 would crash closing it again
    // inside MPI_Finalize. Say it (a destructor may have been the one to close it) and
    // end without it (the launcher ends the other ranks).
    if (code == 0)  // (otherwise the job's error was reported already)
      slimpi::log::error("{} (ending without MPI_Finalize: HDF5 cannot shut down cleanly after it)",
                         slimpi::h5::library_damage_report());
    std::fflush(nullptr);
    std::_Exit(code != 0 ? code : 1);
  }
  MPI_Finalize();
  return code;
}
