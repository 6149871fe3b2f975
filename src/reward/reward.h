// Reward styles — verifiers that score a response against a sample's label, a
// registry keyed by the deck's reward.style string (an unknown style lists the valid
// ones). Scores are computed for a whole batch at once (the `command` style runs one
// external process per batch). Called on rollout rank 0 after a step's generation.
//   exact_match  1 if the normalised response equals the normalised label (trimmed,
//                inner whitespace collapsed), else 0
//   math         the last \boxed{...} of the response, else its last number, compared
//                with the label as an exact rational ("0.5" = "1/2" = ".50")
//   countdown    the label is {"target": T, "numbers": [...]}; the response's expression
//                (inside <answer>...</answer> if present, else its last line) must use
//                each number exactly once with + - * / ( ) and equal T: 1, else 0;
//                malformed or hostile input scores 0 and never throws
//   f1           SQuAD token F1 (lower case, punctuation and articles removed)
//   environment  the reward the episode's environment gave (rollout.environment;
//                rollout.env_reward: the last step's or the sum of its steps')
//   command      reward.command gets JSON lines {prompt, response, label} on stdin and
//                answers one number per line within reward.command_timeout_s; a time-out
//                or a bad answer is an error naming the sample, never a silent 0
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/printable.h"
#include "core/registry.h"

namespace slimpi {

struct RewardInput {
  std::string prompt;
  std::string response;
  std::string label;
  float episode_reward = 0;  // a multi-turn episode's reward from its environment (style "environment")
};

class Deck;

struct RewardConfig {
  std::string style = "exact_match";
  std::string command;           // style "command": the program (run through /bin/sh -c)
  double command_timeout_s = 60;
  int64_t command_max_stderr_bytes = 1 << 16;  // the command's stderr logged a call

  // Reads [reward]; style "command" without a command is a collective deck error.
  static RewardConfig from_deck(const Deck& deck);
};

// A style scores a whole batch (one call per rollout round).
using RewardStyle = std::function<std::vector<float>(const RewardConfig&, const std::vector<RewardInput>&)>;
const Registry<RewardStyle>& reward_styles();

std::vector<float> compute_rewards(const RewardConfig& cfg, const std::vector<RewardInput>& batch);


// The single-sample verifiers (exposed for tests).
float exact_match_reward(const std::string& response, const std::string& label);
float math_reward(const std::string& response, const std::string& label);
float countdown_reward(const std::string& response, const std::string& label);
float f1_reward(const std::string& response, const std::string& label);

}  // namespace slimpi
