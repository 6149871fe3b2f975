// The calculator environment — the built-in example of the environment protocol, in
// process (rollout.environment = "calculator") and as a program with no dependencies
// (inputs/envs/calculator.py, rollout.environment = "command"); both give the same
// replies, byte for byte (tests/regression/env_runs.sh compares their runs).
// One tool, `calculator` {"expression": string}: integer + - * and parentheses. A model
// turn with tool calls gets one tool message per call (the value, or "error: ..."),
// reward 0, not done (truncated once max_turns turns are taken); a turn without one is
// the final answer: reward 1 if it equals the label (both stripped of whitespace), else
// 0, done.
#pragma once

#include <memory>
#include <string>

#include "env/environment.h"

namespace slimpi {

// The value of an integer expression as text, or "error: ..." (the same texts as
// inputs/envs/calculator.py): at most 200 characters, values within ±10^18.
std::string calculate(const std::string& expression);

// The reply to a step (the logic both implementations share).
EnvReply calculator_step(const EpisodeAction& action, int64_t max_turns, const std::string& label);

// The in-process environment (rollout.environment = "calculator"): replies ready at once.
std::unique_ptr<Environment> make_calculator_environment();

}  // namespace slimpi
