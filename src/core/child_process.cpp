#include "core/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <slimpi/error.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

extern char** environ;

namespace slimpi {
namespace {

// The keeper's descriptors after set-up: the command's stdin and stdout at 0 and 1,
// the lifeline at 3; nothing else (not the rank's write end of the lifeline, nor any
// other pipe the rank holds), so that only the rank's death closes the lifeline.
constexpr int kLifelineFd = 3;

void reset_signal(int sig) {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = SIG_DFL;
  sigaction(sig, &sa, nullptr);
}

// The command: default signal dispositions (the rank ignores SIGPIPE and handles the
// stop signals), and it dies with the keeper.
[[noreturn]] void exec_command(pid_t keeper, char* const argv[]) {
  for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGUSR1, SIGHUP}) reset_signal(sig);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != keeper) _exit(127);  // the keeper died before prctl took effect
  execve("/bin/sh", argv, environ);
  _exit(127);
}

// Runs in the forked keeper: async-signal-safe calls only.
[[noreturn]] void run_keeper(int cmd_in, int cmd_out, int lifeline, char* const argv[]) {
  setpgid(0, 0);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int sig : {SIGTERM, SIGINT, SIGUSR1, SIGHUP}) reset_signal(sig);
  struct rlimit no_core = {0, 0};
  setrlimit(RLIMIT_CORE, &no_core);  // a keeper that re-raises SIGSEGV must not dump the rank's image
  // Move the three descriptors above any number they might be moved onto, then down.
  const int in = fcntl(cmd_in, F_DUPFD, 10), out = fcntl(cmd_out, F_DUPFD, 10), life = fcntl(lifeline, F_DUPFD, 10);
  if (in < 0 || out < 0 || life < 0) _exit(127);
  if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(life, kLifelineFd) < 0) _exit(127);
  fcntl(kLifelineFd, F_SETFD, FD_CLOEXEC);  // the command does not hold it
  if (syscall(SYS_close_range, kLifelineFd + 1, ~0U, 0) != 0)
    for (int fd = kLifelineFd + 1; fd < 65536; ++fd) close(fd);
  const pid_t keeper = getpid();
  const pid_t cmd = fork();
  if (cmd == 0) exec_command(keeper, argv);
  close(0);  // only the command holds its pipes, so the rank sees their ends when it exits
  close(1);
  if (cmd < 0) _exit(127);
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, cmd, 0));
  for (;;) {
    struct pollfd fds[2] = {{kLifelineFd, POLLIN, 0}, {pidfd, POLLIN, 0}};
    const int n = poll(fds, pidfd >= 0 ? 2 : 1, pidfd >= 0 ? -1 : 10);
    if (n > 0 && fds[0].revents != 0) {  // the rank is gone: the whole group goes with it
      kill(0, SIGKILL);
      _exit(137);
    }
    int status = 0;
    const pid_t r = waitpid(cmd, &status, WNOHANG);
    if (r == cmd) {
      if (WIFSIGNALED(status)) {  // die of the same signal, so the rank reads the command's status
        reset_signal(WTERMSIG(status));
        kill(keeper, WTERMSIG(status));
        _exit(128 + WTERMSIG(status));
      }
      _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 127);
    }
    if (r < 0 && errno != EINTR) _exit(127);
  }
}

}  // namespace

ChildProcess::ChildProcess(const std::string& command) {
  int to_child[2], from_child[2], lifeline[2];
  SLIMPI_CHECK(pipe2(to_child, O_CLOEXEC) == 0, "cannot start '{}': pipe failed: {}", command, std::strerror(errno));
  if (pipe2(from_child, O_CLOEXEC) != 0 || pipe2(lifeline, O_CLOEXEC) != 0) {
    const int e = errno;
    close(to_child[0]);
    close(to_child[1]);
    SLIMPI_FAIL("cannot start '{}': pipe failed: {}", command, std::strerror(e));
  }
  // Everything the children need is made before fork: they may not allocate.
  char sh[] = "sh", dash_c[] = "-c";
  std::string text = command;
  char* const argv[] = {sh, dash_c, text.data(), nullptr};
  const pid_t pid = fork();
  if (pid == 0) run_keeper(to_child[0], from_child[1], lifeline[0], argv);
  const int fork_errno = errno;
  close(to_child[0]);
  close(from_child[1]);
  close(lifeline[0]);
  if (pid < 0) {
    close(to_child[1]);
    close(from_child[0]);
    close(lifeline[1]);
    SLIMPI_FAIL("cannot start '{}': fork failed: {}", command, std::strerror(fork_errno));
  }
  setpgid(pid, pid);  // also here: a kill(-pid) right after fork must find the group
  pid_ = pid;
  in_ = to_child[1];
  out_ = from_child[0];
  lifeline_ = lifeline[1];
  fcntl(in_, F_SETFL, O_NONBLOCK);
  fcntl(out_, F_SETFL, O_NONBLOCK);
}

ChildProcess::~ChildProcess() {
  close_stdin();
  close_stdout();
  kill(-pid_, SIGKILL);  // the keeper, the command and the command's own children
  if (!reaped_) waitpid(pid_, nullptr, 0);
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

bool ChildProcess::wait_until(std::chrono::steady_clock::time_point deadline, int* status) {
  while (true) {
    const pid_t r = waitpid(pid_, status, WNOHANG);
    if (r == pid_ || (r < 0 && errno != EINTR)) {
      reaped_ = true;
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
