// The agent endpoint's bearer token: 32 random bytes as hex, made once per job by world
// rank 0 in the run directory (agent_token, mode 0600, replaced by the next job), read by
// every rollout rank's endpoint and handed to the agents it starts.
#pragma once

#include <string>

namespace slimpi {

std::string agent_token_path(const std::string& run_dir);
// Writes a new token; "" on success, else why not. *token: the token written.
std::string write_agent_token(const std::string& run_dir, std::string* token = nullptr);
// The job's token; throws slimpi::Error naming the file when it is missing or malformed.
std::string read_agent_token(const std::string& run_dir);
// The token as world rank 0 made it, broadcast to every rank at the job's start (a rank on
// another node may not see rank 0's new file at once on a network file system); set once
// by `slimpi run` and `slimpi generate`.
void set_job_agent_token(const std::string& token);
// That token, or, where none was set (a test), the run directory's file.
std::string job_agent_token(const std::string& run_dir);

}  // namespace slimpi
