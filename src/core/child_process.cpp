#include "core/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <slimpi/error.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

extern char** environ;

namespace slimpi {
namespace {

// Default dispositions for the child: the rank ignores SIGPIPE and handles the stop
// signals, and execve keeps ignored signals ignored. Async-signal-safe.
void reset_signals() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = SIG_DFL;
  for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGUSR1, SIGHUP, SIGQUIT}) sigaction(sig, &sa, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

// Everything above stderr: HDF5's and MPI's descriptors are not close-on-exec, and a
// command must hold neither a run file nor the lifeline's write end. Async-signal-safe.
void close_from_3() {
  if (syscall(SYS_close_range, 3U, ~0U, 0U) != 0)
    for (int fd = 3; fd < 65536; ++fd) close(fd);
}

// The command: leads group G, stdin/stdout on the rank's pipes, dies with the rank's
// thread too (PR_SET_PDEATHSIG). Async-signal-safe calls only.
[[noreturn]] void exec_command(pid_t rank, int in, int out, int err, char* const argv[]) {
  setpgid(0, 0);
  reset_signals();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != rank) _exit(127);  // the rank died before prctl took effect
  if (dup2(in, STDIN_FILENO) < 0 || dup2(out, STDOUT_FILENO) < 0) _exit(127);
  if (err >= 0 && dup2(err, STDERR_FILENO) < 0) _exit(127);
  close_from_3();
  execve("/bin/sh", argv, environ);
  _exit(127);
}

// The watcher: joins group G and kills it when the lifeline (its stdin) reaches EOF.
[[noreturn]] void exec_watcher(pid_t group, int lifeline, char* const argv[]) {
  if (setpgid(0, group) != 0) _exit(127);  // outside G, `kill 0` would hit the rank's own group
  reset_signals();
  if (dup2(lifeline, STDIN_FILENO) < 0) _exit(127);
  const int null_fd = open("/dev/null", O_WRONLY);
  if (null_fd >= 0) dup2(null_fd, STDOUT_FILENO);  // not the rank's stdout
  close_from_3();
  execve("/bin/sh", argv, environ);
  _exit(127);
}

void close_all(std::initializer_list<int> fds) {
  for (int fd : fds)
    if (fd >= 0) close(fd);
}

}  // namespace

ChildProcess::ChildProcess(const std::string& command, bool capture_stderr) {
  int to_child[2] = {-1, -1}, from_child[2] = {-1, -1}, lifeline[2] = {-1, -1}, err_pipe[2] = {-1, -1};
  if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0 || pipe2(lifeline, O_CLOEXEC) != 0 ||
      (capture_stderr && pipe2(err_pipe, O_CLOEXEC) != 0)) {
    const int e = errno;
    close_all({to_child[0], to_child[1], from_child[0], from_child[1], lifeline[0], lifeline[1], err_pipe[0],
               err_pipe[1]});
    SLIMPI_FAIL("cannot start '{}': pipe failed: {}", command, std::strerror(e));
  }
  // Everything the children need is made before fork: they may not allocate.
  char sh[] = "sh", dash_c[] = "-c", watch[] = "read -r _; kill -KILL 0";
  std::string text = command;
  char* const command_argv[] = {sh, dash_c, text.data(), nullptr};
  char* const watcher_argv[] = {sh, dash_c, watch, nullptr};
  const pid_t rank = getpid();
  const pid_t pid = fork();
  if (pid == 0) exec_command(rank, to_child[0], from_child[1], err_pipe[1], command_argv);
  const int fork_errno = errno;
  if (pid > 0) {
    setpgid(pid, pid);  // also here: the group exists before the watcher joins it
    watcher_ = fork();
    if (watcher_ == 0) exec_watcher(pid, lifeline[0], watcher_argv);
    if (watcher_ > 0) setpgid(watcher_, pid);
  }
  close_all({to_child[0], from_child[1], lifeline[0], err_pipe[1]});
  if (pid < 0 || watcher_ < 0) {
    const int e = pid < 0 ? fork_errno : errno;
    if (pid > 0) {
      kill(-pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    close_all({to_child[1], from_child[0], lifeline[1], err_pipe[0]});
    SLIMPI_FAIL("cannot start '{}': fork failed: {}", command, std::strerror(e));
  }
  pid_ = pid;
  in_ = to_child[1];
  out_ = from_child[0];
  lifeline_ = lifeline[1];
  err_ = err_pipe[0];
  fcntl(in_, F_SETFL, O_NONBLOCK);
  fcntl(out_, F_SETFL, O_NONBLOCK);
  if (err_ >= 0) fcntl(err_, F_SETFL, O_NONBLOCK);
}

ChildProcess::~ChildProcess() {
  close_stdin();
  close_stdout();
  close_stderr();
  kill(-pid_, SIGKILL);  // the command, its own children and the watcher
  if (!reaped_) waitpid(pid_, nullptr, 0);
  waitpid(watcher_, nullptr, 0);
  close(lifeline_);
}

void ChildProcess::close_stdin() {
  if (in_ >= 0) close(in_);
  in_ = -1;
}

void ChildProcess::close_stdout() {
  if (out_ >= 0) close(out_);
  out_ = -1;
}

void ChildProcess::close_stderr() {
  if (err_ >= 0) close(err_);
  err_ = -1;
}

bool ChildProcess::wait_until(std::chrono::steady_clock::time_point deadline, int* status) {
  while (true) {
    const pid_t r = waitpid(pid_, status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return true;
    }
    if (r < 0 && errno != EINTR) {  // (ECHILD: someone else reaped it) not a success
      reaped_ = true;
      *status = W_EXITCODE(127, 0);
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    usleep(2000);
  }
}

std::string ChildProcess::describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exit status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("wait status {}", status);
}

}  // namespace slimpi
