#include "core/child_process.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <slimpi/error.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>

#include <fmt/format.h>

extern char** environ;

namespace slimpi {
namespace {

// Default dispositions for the child, then no signal blocked: every signal the rank
// catches (its stop signals, MPI's and UCX's fault handlers, a profiler's) is reset before
// anything is unblocked, since after vfork a handler would run on the rank's memory; the
// rank ignores SIGPIPE, and execve keeps ignored signals ignored, so it is reset too.
// A signal already pending was sent to the rank's process group before setpgid() took the
// child out of it (mpirun forwards SIGUSR1, SIGUSR2 and SIGTERM to the ranks' groups): the
// rank's, not the command's, so it is discarded (setting SIG_IGN discards a pending
// signal) rather than delivered under the default action, which would kill the command.
// Async-signal-safe.
void reset_signals() {
  struct sigaction dfl, ign, old;
  std::memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  std::memset(&ign, 0, sizeof(ign));
  ign.sa_handler = SIG_IGN;
  sigset_t pending;
  sigemptyset(&pending);
  sigpending(&pending);
  for (int sig = 1; sig < NSIG; ++sig)
    if (sigismember(&pending, sig) == 1 && sigaction(sig, &ign, &old) == 0) sigaction(sig, &old, nullptr);
  for (int sig = 1; sig < NSIG; ++sig)
    if (sigaction(sig, nullptr, &old) == 0 && (old.sa_handler != SIG_IGN || sig == SIGPIPE))
      sigaction(sig, &dfl, nullptr);  // (SIGKILL and SIGSTOP refuse; nothing to reset there)
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
// thread too (PR_SET_PDEATHSIG). Async-signal-safe calls only. Not inlined: after vfork
// the child runs in frames of its own below the caller's (the caller's are the rank's).
[[noreturn]] __attribute__((noinline)) void exec_command(pid_t rank, int in, int out, int err, char* const argv[], char* const envp[]) {
  setpgid(0, 0);
  reset_signals();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != rank) _exit(127);  // the rank died before prctl took effect
  if (dup2(in, STDIN_FILENO) < 0 || dup2(out, STDOUT_FILENO) < 0) _exit(127);
  if (err >= 0 && dup2(err, STDERR_FILENO) < 0) _exit(127);
  close_from_3();
  execve("/bin/sh", argv, envp);
  _exit(127);
}

// The watcher: joins group G and kills it when the lifeline (its stdin) reaches EOF.
[[noreturn]] __attribute__((noinline)) void exec_watcher(pid_t group, int lifeline, char* const argv[],
                                                         char* const envp[]) {
  if (setpgid(0, group) != 0) _exit(127);  // outside G, `kill 0` would hit the rank's own group
  reset_signals();
  if (dup2(lifeline, STDIN_FILENO) < 0) _exit(127);
  const int null_fd = open("/dev/null", O_WRONLY);
  if (null_fd >= 0) dup2(null_fd, STDOUT_FILENO);  // not the rank's stdout
  close_from_3();
  execve("/bin/sh", argv, envp);
  _exit(127);
}

// vfork and the child's exec, in a frame of their own that only returns the pid (as
// CPython's subprocess isolates its vfork): nothing of the caller's frame is shared
// with the child.
__attribute__((noinline)) pid_t vfork_command(pid_t rank, int in, int out, int err, char* const argv[],
                                              char* const envp[]) {
  const pid_t pid = vfork();
  if (pid == 0) exec_command(rank, in, out, err, argv, envp);
  return pid;
}

__attribute__((noinline)) pid_t vfork_watcher(pid_t group, int lifeline, char* const argv[], char* const envp[]) {
  const pid_t pid = vfork();
  if (pid == 0) exec_watcher(group, lifeline, argv, envp);
  return pid;
}

// Whether `command` is one program and its arguments, so that `exec` can run it in place
// of sh: no shell operator, redirection, substitution or assignment, a first word that is
// no shell builtin and names an executable file (a path, or found on PATH).
// Conservative: anything else stays under sh.
bool is_simple_command(const std::string& command) {
  if (command.find_first_of(";&|()<>`$\n\\") != std::string::npos) return false;
  const size_t begin = command.find_first_not_of(" \t");
  if (begin == std::string::npos) return false;
  const std::string first = command.substr(begin, command.find_first_of(" \t", begin) - begin);
  static const std::set<std::string> builtins = {"cd",    "export", "set",    "unset",    "ulimit", "umask",
                                                 "alias", "eval",   "exec",   "exit",     "read",   "shift",
                                                 "trap",  "wait",   "source", "command",  "local",  "readonly",
                                                 "return", "break", "continue", ".",      ":",      "time"};
  if (builtins.count(first) ||
      first.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./+-") !=
          std::string::npos)
    return false;
  if (first.find('/') != std::string::npos) return ::access(first.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  for (std::string dirs = path ? path : ""; !dirs.empty();) {
    const size_t colon = dirs.find(':');
    const std::string dir = dirs.substr(0, colon);
    dirs = colon == std::string::npos ? "" : dirs.substr(colon + 1);
    if (!dir.empty() && ::access((dir + "/" + first).c_str(), X_OK) == 0) return true;
  }
  return false;
}

void close_all(std::initializer_list<int> fds) {
  for (int fd : fds)
    if (fd >= 0) close(fd);
}

}  // namespace

std::string command_under_limits(const std::string& command, double cpu_limit_s, int64_t memory_limit_mb) {
  std::string prefix;
  if (cpu_limit_s > 0) prefix += fmt::format("ulimit -t {}; ", int64_t(std::ceil(cpu_limit_s)));
  if (memory_limit_mb > 0) prefix += fmt::format("ulimit -v {}; ", memory_limit_mb * 1024);
  return prefix + (is_simple_command(command) ? "exec " : "") + command;
}

ChildProcess::ChildProcess(const std::string& command, bool capture_stderr, const std::vector<std::string>& extra_env) {
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
  // The command's environment: the rank's, with extra_env's names replaced.
  std::vector<std::string> env_text;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('=') + 1);
    bool replaced = false;
    for (const std::string& x : extra_env)
      replaced = replaced || (!x.empty() && x.back() == '*' ? entry.compare(0, x.size() - 1, x, 0, x.size() - 1) == 0
                                              : x.compare(0, name.size(), name) == 0);
    if (!replaced) env_text.push_back(entry);
  }
  for (const std::string& x : extra_env)
    if (!x.empty() && x.back() != '*') env_text.push_back(x);
  std::vector<char*> envp;
  for (std::string& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t rank = getpid();
  // vfork: the child shares the rank's memory until it execs, so no page tables of a
  // large rank (LibTorch, the model, the KV cache) are copied for each command; the rank's
  // thread waits for the exec. The child makes only system calls, in frames of its own
  // (it may set this thread's errno; the rank reads errno only when vfork itself failed).
  // Every signal is blocked around the vforks, so that none of the rank's handlers runs in a
  // child before reset_signals() restores the defaults and unblocks.
  sigset_t all, before;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &before);
  const pid_t pid = vfork_command(rank, to_child[0], from_child[1], err_pipe[1], command_argv, envp.data());
  const int fork_errno = errno;
  if (pid > 0) watcher_ = vfork_watcher(pid, lifeline[0], watcher_argv, envp.data());  // group G exists: pid exec'd
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
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
