#include "core/stop_signal.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

namespace slimpi {
namespace {

std::atomic<int> g_signal{0};

void on_stop_signal(int sig) {
  int expected = 0;
  if (g_signal.compare_exchange_strong(expected, sig)) return;
  // A second request: leave now (async-signal-safe calls only).
  const char msg[] = "slimpi: second stop signal, exiting at once without a checkpoint\n";
  ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof(msg) - 1);
  (void)ignored;
  ::_exit(128 + sig);
}

}  // namespace

void install_stop_signal_handlers() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

int pending_stop_signal() { return g_signal.load(); }

std::string signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGINT: return "SIGINT";
    default: return "signal " + std::to_string(sig);
  }
}

}  // namespace slimpi
