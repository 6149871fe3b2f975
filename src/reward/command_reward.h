// The `command` reward style: one external process per batch (run as /bin/sh -c
// COMMAND) reads JSON lines {prompt, response, label} on stdin and writes one number
// per line to stdout. Input and output are pumped with poll() so neither side can
// block the other; past `timeout_s` the process is killed. Errors name the sample:
// a time-out, a process that exits early or fails, a line that is not a number.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "reward/reward.h"

namespace slimpi {

// Runs `command` once for the batch (core/child_process.h: it dies with this rank,
// however the rank ends). Its process group is killed when the call ends, whatever the
// outcome; a command that prints more than kMaxRewardOutputBytesPerSample bytes per
// sample, does not exit within timeout_s (even after closing its stdout),
// crashes, or answers anything but one finite number per sample is an error naming
// the command and the sample. Its stderr goes to the log through core/stderr_log.h, at
// most max_stderr_bytes of it a call (reward.command_max_stderr_bytes), its last lines
// before any error.
constexpr size_t kMaxRewardOutputBytesPerSample = 4096;
std::vector<float> command_rewards(const std::string& command, double timeout_s, const std::vector<RewardInput>& batch,
                                   int64_t max_stderr_bytes = 1 << 16);

}  // namespace slimpi
