#include "reward/command_reward.h"

#include <poll.h>
#include <signal.h>
#include <slimpi/error.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/child_process.h"
#include "core/stderr_log.h"

namespace slimpi {
namespace {

std::string describe(const std::vector<RewardInput>& batch, size_t i) {
  return fmt::format("sample {} of {} (response \"{}\")", i, batch.size(), printable_excerpt(batch[i].response));
}

// Where the command was when it stopped, after `answered` numbers: "at sample 3 of 16
// (response ...)", or "after answering all 16 samples".
std::string progress(const std::vector<RewardInput>& batch, size_t answered) {
  if (answered >= batch.size()) return fmt::format("after answering all {} samples", batch.size());
  return "at " + describe(batch, answered);
}

// One JSON line per sample: {"prompt", "response", "label"}. Responses are raw bytes from
// the model: invalid UTF-8 is replaced (U+FFFD), not fatal.
std::string reward_input(const std::vector<RewardInput>& batch) {
  std::string input;
  for (const auto& b : batch)
    input += nlohmann::json{{"prompt", b.prompt}, {"response", b.response}, {"label", b.label}}.dump(
                 -1, ' ', false, nlohmann::json::error_handler_t::replace) +
             "\n";
  return input;
}

// What the command printed, how it ended, and whether the deadline passed first.
struct CommandRun {
  std::string output;
  int status = 0;
  bool timed_out = false;
};

// Feeds `input` to `command` on its stdin while reading its stdout (and draining its stderr
// into the log) until it closes its stdout and exits, or `timeout_s` passes. More than
// `max_output` bytes of output end the call.
CommandRun run_command(const std::string& command, const std::string& input, double timeout_s, size_t max_output,
                       size_t n_samples, int64_t max_stderr_bytes) {
  signal(SIGPIPE, SIG_IGN);  // a child that exits early must not kill us
  ChildProcess child(command, /*capture_stderr=*/true);  // killed with its whole process group when this call ends
  StderrLog err("reward.command", max_stderr_bytes, "reward.command_max_stderr_bytes");
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s));
  size_t written = 0;
  CommandRun run;
  while (child.stdout_fd() >= 0) {
    if (written == input.size()) child.close_stdin();
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      run.timed_out = true;
      break;
    }
    // (its stderr too, drained each round: a command blocked on a full stderr pipe would never finish)
    pollfd fds[3] = {{child.stdout_fd(), POLLIN, 0}, {child.stderr_fd(), POLLIN, 0}, {child.stdin_fd(), POLLOUT, 0}};
    int n = poll(fds, 3, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    err.drain(child);
    if (n < 0 && errno != EINTR) break;
    if (child.stdin_fd() >= 0 && (fds[2].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t w = write(child.stdin_fd(), input.data() + written, input.size() - written);
      if (w > 0) written += size_t(w);
      else if (w < 0 && errno != EAGAIN) child.close_stdin();  // the child closed its stdin
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[4096];
      ssize_t r = read(child.stdout_fd(), buf, sizeof(buf));
      if (r > 0) run.output.append(buf, size_t(r));
      else if (r == 0 || errno != EAGAIN) child.close_stdout();
      if (run.output.size() > max_output)
        SLIMPI_FAIL("reward.command '{}' printed more than {} bytes for {} samples (at most {} per sample): "
                    "expected one number per line; the command was killed",
                    command, max_output, n_samples, kMaxRewardOutputBytesPerSample);
    }
  }
  // Its stdout is closed (or the time is up): it must also exit before the deadline.
  if (!run.timed_out && !child.wait_until(deadline, &run.status)) run.timed_out = true;
  err.drain(child, /*final=*/true);  // its last words before any verdict
  return run;
}

// One number per non-blank line, in input order.
std::vector<float> parse_rewards(const std::string& output, const std::vector<RewardInput>& batch) {
  std::vector<float> rewards;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    char* end = nullptr;
    double v = std::strtod(line.c_str(), &end);
    while (end && *end && std::isspace(static_cast<unsigned char>(*end))) ++end;
    if (end == line.c_str() || (end && *end))
      SLIMPI_FAIL("reward.command answered \"{}\" {}: expected one number per line", printable_excerpt(line),
                  rewards.size() < batch.size() ? "for " + describe(batch, rewards.size())
                                                : fmt::format("after all {} samples had their number", batch.size()));
    rewards.push_back(static_cast<float>(v));
  }
  return rewards;
}

}  // namespace

std::vector<float> command_rewards(const std::string& command, double timeout_s, const std::vector<RewardInput>& batch,
                                   int64_t max_stderr_bytes) {
  SLIMPI_CHECK(!command.empty(), "reward.style = \"command\" needs reward.command");
  // The answer is one number per line: anything past this is a runaway command.
  const size_t max_output = kMaxRewardOutputBytesPerSample * std::max<size_t>(batch.size(), 1);
  const CommandRun run = run_command(command, reward_input(batch), timeout_s, max_output, batch.size(),
                                     max_stderr_bytes);
  const std::vector<float> rewards = parse_rewards(run.output, batch);
  if (run.timed_out)
    SLIMPI_FAIL("reward.command '{}' timed out after {} s (reward.command_timeout_s) {}; it was killed", command,
                timeout_s, progress(batch, rewards.size()));
  if (!WIFEXITED(run.status) || WEXITSTATUS(run.status) != 0)
    SLIMPI_FAIL("reward.command '{}' failed ({}) {}", command, ChildProcess::describe_status(run.status),
                progress(batch, rewards.size()));
  if (rewards.size() < batch.size())
    SLIMPI_FAIL("reward.command gave {} numbers for {} samples: missing the one for {}", rewards.size(), batch.size(),
                describe(batch, rewards.size()));
  if (rewards.size() > batch.size())
    SLIMPI_FAIL("reward.command gave {} numbers for {} samples: {} more than samples (expected one number per line, "
                "one line per sample, in input order)",
                rewards.size(), batch.size(), rewards.size() - batch.size());
  return rewards;
}

}  // namespace slimpi
