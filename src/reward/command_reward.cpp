#include "reward/command_reward.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <slimpi/error.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace slimpi {
namespace {

struct Child {
  pid_t pid = -1;
  int in = -1;   // we write the child's stdin
  int out = -1;  // we read the child's stdout
};

Child spawn(const std::string& command) {
  int to_child[2], from_child[2];
  SLIMPI_CHECK(pipe(to_child) == 0 && pipe(from_child) == 0, "reward.command: pipe failed: {}", std::strerror(errno));
  pid_t pid = fork();
  SLIMPI_CHECK(pid >= 0, "reward.command: fork failed: {}", std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);  // its own process group: a time-out kills the command's children too
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // and a rank that dies (aborted job) takes its shell with it
    dup2(to_child[0], STDIN_FILENO);
    dup2(from_child[1], STDOUT_FILENO);
    close(to_child[0]);
    close(to_child[1]);
    close(from_child[0]);
    close(from_child[1]);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  fcntl(to_child[1], F_SETFL, O_NONBLOCK);
  fcntl(from_child[0], F_SETFL, O_NONBLOCK);
  return {pid, to_child[1], from_child[0]};
}

std::string describe(const std::vector<RewardInput>& batch, size_t i) {
  if (i >= batch.size()) return fmt::format("after the last of {} samples", batch.size());
  return fmt::format("sample {} of {} (response \"{}\")", i, batch.size(), printable_excerpt(batch[i].response));
}

// The child's whole process group, killed and reaped however command_rewards ends
// (return, error, time-out): no reward process outlives its batch.
class ChildGuard {
 public:
  explicit ChildGuard(const Child& c) : c_(c) {}
  ~ChildGuard() {
    if (c_.in >= 0) close(c_.in);
    if (c_.out >= 0) close(c_.out);
    kill(-c_.pid, SIGKILL);  // the command's own children too (they share its group)
    if (!reaped_) waitpid(c_.pid, nullptr, 0);
  }
  Child& child() { return c_; }
  // Waits for the child until `deadline`; false on time-out. Sets *status.
  bool wait_until(std::chrono::steady_clock::time_point deadline, int* status) {
    while (true) {
      pid_t r = waitpid(c_.pid, status, WNOHANG);
      if (r == c_.pid || (r < 0 && errno != EINTR)) {
        reaped_ = true;
        return true;
      }
      if (std::chrono::steady_clock::now() >= deadline) return false;
      usleep(2000);
    }
  }

 private:
  Child c_;
  bool reaped_ = false;
};

std::string exit_text(int status) {
  if (WIFEXITED(status)) return fmt::format("exit status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("wait status {}", status);
}

}  // namespace

std::vector<float> command_rewards(const std::string& command, double timeout_s, const std::vector<RewardInput>& batch) {
  SLIMPI_CHECK(!command.empty(), "reward.style = \"command\" needs reward.command");
  std::string input;
  for (const auto& b : batch)
    // Responses are raw bytes from the model: invalid UTF-8 is replaced (U+FFFD), not fatal.
    input += nlohmann::json{{"prompt", b.prompt}, {"response", b.response}, {"label", b.label}}.dump(
                 -1, ' ', false, nlohmann::json::error_handler_t::replace) +
             "\n";
  // The answer is one number per line: anything past this is a runaway command.
  const size_t max_output = kMaxRewardOutputBytesPerSample * std::max<size_t>(batch.size(), 1);

  signal(SIGPIPE, SIG_IGN);  // a child that exits early must not kill us
  ChildGuard guard(spawn(command));
  Child& c = guard.child();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s));
  size_t written = 0;
  std::string output;
  bool timed_out = false;
  while (c.out >= 0) {
    if (written == input.size() && c.in >= 0) {
      close(c.in);
      c.in = -1;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd fds[2] = {{c.out, POLLIN, 0}, {c.in, POLLOUT, 0}};
    int n = poll(fds, c.in >= 0 ? 2 : 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (n < 0 && errno != EINTR) break;
    if (c.in >= 0 && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t w = write(c.in, input.data() + written, input.size() - written);
      if (w > 0) written += size_t(w);
      else if (w < 0 && errno != EAGAIN) {  // the child closed its stdin
        close(c.in);
        c.in = -1;
      }
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[4096];
      ssize_t r = read(c.out, buf, sizeof(buf));
      if (r > 0) output.append(buf, size_t(r));
      else if (r == 0 || errno != EAGAIN) {
        close(c.out);
        c.out = -1;
      }
      if (output.size() > max_output)
        SLIMPI_FAIL("reward.command '{}' printed more than {} bytes for {} samples (at most {} per sample): "
                    "expected one number per line; the command was killed",
                    command, max_output, batch.size(), kMaxRewardOutputBytesPerSample);
    }
  }
  // Its stdout is closed (or the time is up): it must also exit before the deadline.
  int status = 0;
  if (!timed_out && !guard.wait_until(deadline, &status)) timed_out = true;

  std::vector<float> rewards;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    char* end = nullptr;
    double v = std::strtod(line.c_str(), &end);
    while (end && *end && std::isspace(static_cast<unsigned char>(*end))) ++end;
    if (end == line.c_str() || (end && *end))
      SLIMPI_FAIL("reward.command answered \"{}\" for {}: expected one number per line", printable_excerpt(line),
                  describe(batch, rewards.size()));
    rewards.push_back(static_cast<float>(v));
  }
  if (timed_out)
    SLIMPI_FAIL("reward.command '{}' timed out after {} s (reward.command_timeout_s) at {}; it was killed", command,
                timeout_s, describe(batch, rewards.size()));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    SLIMPI_FAIL("reward.command '{}' failed ({}) at {}", command, exit_text(status), describe(batch, rewards.size()));
  if (rewards.size() != batch.size())
    SLIMPI_FAIL("reward.command gave {} numbers for {} samples: missing the one for {}", rewards.size(), batch.size(),
                describe(batch, rewards.size()));
  return rewards;
}

}  // namespace slimpi
