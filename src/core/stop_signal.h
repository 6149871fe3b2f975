// Stop requests by signal: SIGTERM, and SIGUSR1 (what Slurm sends with
// --signal=USR1@N before a job's time limit), ask the run to finish the step in
// flight, write a checkpoint and exit 0. A second such signal ends the process at
// once (exit 128 + signal). The handler only records the signal; the driver polls
// pending_stop_signal() at each step boundary and agrees on it over all ranks.
#pragma once

#include <string>

namespace slimpi {

// Installs the handlers (once per process; later calls do nothing).
void install_stop_signal_handlers();
// The first stop signal received, or 0.
int pending_stop_signal();
// "SIGTERM", "SIGUSR1", ...
std::string signal_name(int sig);

}  // namespace slimpi
