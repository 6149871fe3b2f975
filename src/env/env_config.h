// EnvConfig — the [rollout] keys of multi-turn environments (rollout.environment and
// rollout.env_*), as the episode runner and the environment processes want them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/chat_template.h"

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

  // rollout.environment = "agent" (agent/agent_environment.h): one agent program per episode,
  // served over HTTP. rollout.env_timeout_s bounds the wait for each request.
  std::string agent_command;         // rollout.agent_command: run through /bin/sh -c per episode
  std::string agent_host = "127.0.0.1";  // rollout.agent_host: the interface the endpoint binds
  int64_t agent_port = 0;            // rollout.agent_port: 0 = one the system picks (per rollout rank)
  int64_t agent_max_sessions = 64;   // rollout.agent_max_sessions: episodes at once per rollout rank
  int64_t agent_max_session_requests = 4;  // rollout.agent_max_session_requests: a session's requests at once (in turn)
  std::string agent_model = "slimpi-policy";  // rollout.agent_model: the model name the endpoint answers to
  int64_t agent_max_request_bytes = 8 << 20;  // rollout.agent_max_request_bytes: a longer body gets 413
  std::string run_dir;               // the job's run directory (set by the driver): where agent_token is
  ChatFormat chat;                   // data.chat_template and its options as resolved (set by RolloutConfig)

  bool enabled() const { return name != "none"; }
  static EnvConfig from_deck(const Deck& deck);
};

}  // namespace slimpi
