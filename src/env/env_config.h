// EnvConfig — the [rollout] keys of multi-turn environments (rollout.environment and
// rollout.env_*), as the episode runner and the environment processes want them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slimpi {

class Deck;

struct EnvConfig {
  std::string name = "none";  // rollout.environment
  std::string command;        // "command": run through /bin/sh -c
  int64_t processes = 1;      // per rollout rank
  double timeout_s = 60;      // per call (reset or step)
  int64_t max_reply_bytes = 1 << 20;
  int64_t max_stderr_bytes = 1 << 16;  // logged per process start; the rest dropped
  double cpu_limit_s = 0;       // RLIMIT_CPU per process (0: none)
  int64_t memory_limit_mb = 0;  // RLIMIT_AS per process (0: none)
  int64_t max_restarts = 10;    // per process and run; beyond: the job ends
  bool fail_job = false;        // an episode's environment failure ends the job
  int64_t max_turns = 8;
  int64_t max_total_tokens = 0;  // response tokens of an episode (model + observations); 0 = 4 x max_new_tokens
  int64_t max_observation_tokens = 1024;
  std::string reward = "last";  // "last" | "sum"
  double episode_wall_s = 0;    // wall time per episode (0: none)

  bool enabled() const { return name != "none"; }
  static EnvConfig from_deck(const Deck& deck);
};

}  // namespace slimpi
