#include <slimpi/deck.h>
#include <slimpi/error.h>

#include "env/agent_environment.h"
#include "env/calculator_environment.h"
#include "env/command_environment.h"
#include "env/environment.h"

namespace slimpi {

void Environment::restore(const EpisodeStart& start, int64_t, const std::string&) {
  SLIMPI_FAIL("environment {} cannot restore episode {}: it does not take snapshots", info().name, start.episode);
}

const Registry<EnvFactory>& environments() {
  static const Registry<EnvFactory> r = [] {
    Registry<EnvFactory> reg("rollout.environment");
    reg.add("none", EnvFactory());
    reg.add("command", [](const EnvConfig& cfg, int64_t vocab_size) -> std::unique_ptr<Environment> {
      return std::make_unique<CommandEnvironment>(cfg, vocab_size);
    });
    reg.add("calculator", [](const EnvConfig&, int64_t) { return make_calculator_environment(); });
    reg.add("agent", [](const EnvConfig& cfg, int64_t) -> std::unique_ptr<Environment> {
      return std::make_unique<AgentEnvironment>(cfg);
    });
    return reg;
  }();
  return r;
}

EnvConfig EnvConfig::from_deck(const Deck& deck) {
  EnvConfig c;
  c.name = deck.get_string("rollout.environment");
  c.command = deck.get_string("rollout.env_command");
  c.processes = deck.get_int("rollout.env_processes");
  c.timeout_s = deck.get_float("rollout.env_timeout_s");
  c.max_reply_bytes = deck.get_int("rollout.env_max_reply_bytes");
  c.max_stderr_bytes = deck.get_int("rollout.env_max_stderr_bytes");
  c.cpu_limit_s = deck.get_float("rollout.env_cpu_limit_s");
  c.memory_limit_mb = deck.get_int("rollout.env_memory_limit_mb");
  c.max_restarts = deck.get_int("rollout.env_max_restarts");
  c.fail_job = deck.get_bool("rollout.env_fail_job");
  c.max_turns = deck.get_int("rollout.env_max_turns");
  c.max_total_tokens = deck.get_int("rollout.env_max_total_tokens");
  if (c.max_total_tokens == 0) c.max_total_tokens = 4 * deck.get_int("rollout.max_new_tokens");
  c.max_observation_tokens = deck.get_int("rollout.env_max_observation_tokens");
  c.reward = deck.get_string("rollout.env_reward");
  c.episode_wall_s = deck.get_float("rollout.env_episode_wall_s");
  c.agent_command = deck.get_string("rollout.agent_command");
  c.agent_host = deck.get_string("rollout.agent_host");
  c.agent_port = deck.get_int("rollout.agent_port");
  c.agent_max_sessions = deck.get_int("rollout.agent_max_sessions");
  c.agent_max_session_requests = deck.get_int("rollout.agent_max_session_requests");
  c.agent_model = deck.get_string("rollout.agent_model");
  c.agent_max_request_bytes = deck.get_int("rollout.agent_max_request_bytes");
  if (c.name == "agent" && c.agent_command.empty())
    SLIMPI_FAIL_ALL("rollout.environment = \"agent\" ({}) needs rollout.agent_command: the agent program started per "
                    "episode (docs/agents.md)", deck.source("rollout.environment"));
  if (c.name == "agent" && c.agent_model.empty())
    SLIMPI_FAIL_ALL("rollout.agent_model ({}) is empty: the endpoint needs a model name to serve",
                    deck.source("rollout.agent_model"));
  if (c.name == "command" && c.command.empty())
    SLIMPI_FAIL_ALL("rollout.environment = \"command\" ({}) needs rollout.env_command: the program that speaks the "
                    "environment protocol (docs/environments.md)", deck.source("rollout.environment"));
  // The other ranks wait for a batch's episodes under the watchdog: an environment allowed
  // to take longer than parallel.timeout_s over one reply (or one episode) would have the
  // job ended blaming a dead peer before its own limit fires (as reward.command_timeout_s).
  const double watchdog_s = deck.get_float("parallel.timeout_s");
  for (const char* key : {"rollout.env_timeout_s", "rollout.env_episode_wall_s"}) {
    const double limit = deck.get_float(key);
    if ((c.name == "command" || c.name == "agent") && limit >= watchdog_s)
      SLIMPI_FAIL_ALL("{} = {} ({}) must be below parallel.timeout_s = {} ({}): the ranks that wait for the batch's "
                      "episodes would be stopped by the watchdog first (the wait also holds the batch's generation, so "
                      "leave room for it)", key, limit, deck.source(key), watchdog_s, deck.source("parallel.timeout_s"));
  }
  return c;
}

}  // namespace slimpi
