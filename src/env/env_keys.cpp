// Deck keys of multi-turn environments:
// declared beside the code that reads them, collected by deck_keys() (cli/deck_keys.cpp).
#include "deck/key_tables.h"

#include "env/environment.h"

namespace slimpi {

std::vector<KeySpec> env_keys() {
  return {
      // [rollout]
      choice_key("rollout.environment", "none", environments().names(),
                 "multi-turn episodes (docs/environments.md): every sample talks to an environment turn after turn "
                 "(command = rollout.env_command's processes speaking the JSON-lines protocol; calculator = the "
                 "built-in calculator tool; agent = rollout.agent_command, an agent program per episode calling the "
                 "OpenAI or Anthropic API that slimpi serves, docs/agents.md); none = one response per prompt"),
      string_key("rollout.env_command", "",
                 "environment = command: the program (run through /bin/sh -c), rollout.env_processes of them per "
                 "rollout rank"),
      int_key("rollout.env_processes", 1, 1, 4096, "processes", "environment = command: processes per rollout rank"),
      float_key("rollout.env_timeout_s", 60.0, 0.01, 1e6, "s",
                "environment: time for a reply to a reset or step; past it the episode fails (and its process is "
                "restarted when it has written nothing for that long)"),
      int_key("rollout.env_max_reply_bytes", 1 << 20, 64, 1e10, "bytes",
              "environment = command: longest reply line; a longer one restarts the process"),
      int_key("rollout.env_max_stderr_bytes", 1 << 16, 0, 1e10, "bytes",
              "environment = command or agent: stderr lines of a process logged (prefixed with the process) per process "
              "start; the rest is read and dropped"),
      float_key("rollout.env_cpu_limit_s", 0.0, 0.0, 1e9, "s",
                "environment = command or agent: CPU seconds per process (RLIMIT_CPU over its life; 0 = none)"),
      int_key("rollout.env_memory_limit_mb", 0, 0, 1e9, "MiB",
              "environment = command or agent: address space per process (RLIMIT_AS; 0 = none)"),
      int_key("rollout.env_max_restarts", 10, 0, 1e9, "restarts",
              "environment = command: restarts of one process after failures before the job ends"),
      bool_key("rollout.env_fail_job", false,
               "environment: an episode whose environment fails ends the job (default: that episode ends with "
               "status 8 env_failed and its group is not trained)"),
      int_key("rollout.env_max_turns", 8, 1, 1e6, "turns", "environment: model turns per episode at most"),
      int_key("rollout.env_max_total_tokens", 0, 0, 1e9, "tokens",
              "environment: response tokens of an episode (model and observation tokens; 0 = 4 x rollout.max_new_tokens); "
              "rollout.max_new_tokens bounds each model turn"),
      int_key("rollout.env_max_observation_tokens", 1024, 1, 1e9, "tokens",
              "environment: a longer observation ends its episode (truncated, error class overlong)"),
      choice_key("rollout.env_reward", "last", {"last", "sum"},
                 "environment: an episode's reward is its last step's reward, or the sum over its steps"),
      float_key("rollout.env_episode_wall_s", 0.0, 0.0, 1e9, "s",
                "environment: an episode is truncated at its first turn boundary past this wall time (0 = none)"),
      string_key("rollout.agent_command", "",
                 "environment = agent (docs/agents.md): the agent program, started per episode through /bin/sh -c with "
                 "OPENAI_BASE_URL, OPENAI_API_KEY, ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY and SLIMPI_PROMPT set; "
                 "rollout.env_cpu_limit_s and env_memory_limit_mb limit it"),
      string_key("rollout.agent_host", "127.0.0.1",
                 "environment = agent: the interface the HTTP endpoint binds on each rollout rank (0.0.0.0: every "
                 "interface, for agents on other nodes)"),
      int_key("rollout.agent_port", 0, 0, 65535, "port",
              "environment = agent: the endpoint's TCP port on each rollout rank (0: one the system picks; a fixed "
              "port serves one rollout rank per node)"),
      int_key("rollout.agent_max_sessions", 64, 1, 4096, "sessions",
              "environment = agent: episodes (agent programs) at once per rollout rank; more wait for a slot"),
      int_key("rollout.agent_max_session_requests", 4, 1, 64, "requests",
              "environment = agent: requests of one session at once (sub-agents calling in parallel), answered one "
              "after another in the order they arrive; more get 429"),
      string_key("rollout.agent_model", "slimpi-policy",
                 "environment = agent: the model name the endpoint serves (GET /v1/models); a request naming another "
                 "model gets 404"),
      int_key("rollout.agent_max_request_bytes", 8 << 20, 1024, 1e10, "bytes",
              "environment = agent: a longer request body gets 413")
  };
}

}  // namespace slimpi
