// The agent endpoint's bearer token: 32 random bytes as hex, made once per job by world
// rank 0 in the run directory (agent_token, mode 0600, replaced by the next job), read by
// every rollout rank's endpoint and handed to the agents it starts.
#pragma once

#include <string>

namespace slimpi {

std::string agent_token_path(const std::string& run_dir);
// Writes a new token; "" on success, else why not.
std::string write_agent_token(const std::string& run_dir);
// The job's token; throws slimpi::Error naming the file when it is missing or malformed.
std::string read_agent_token(const std::string& run_dir);

}  // namespace slimpi
