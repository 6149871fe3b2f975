// AgentEnvironment — rollout.environment = "agent": unmodified agent programs written
// against the OpenAI Chat Completions or Responses API or the Anthropic Messages API drive
// the episodes (docs/agents.md). Each
// rollout rank serves an HTTP endpoint (agent/http_server.h) and starts
// rollout.agent_command once per episode, with OPENAI_BASE_URL and ANTHROPIC_BASE_URL
// naming the episode's session, the job's token as OPENAI_API_KEY and ANTHROPIC_API_KEY,
// and the task as SLIMPI_PROMPT (the record's prompt as the file holds it, not rendered),
// SLIMPI_LABEL, SLIMPI_METADATA. An agent may speak OpenAI
// Chat Completions (agent/openai_chat.h), OpenAI Responses (agent/openai_responses.h: a
// previous_response_id names the session's latest answer, whose conversation the session
// holds) or Anthropic Messages (agent/anthropic_messages.h), or all of them: a session's
// history is the same conversation either way.
//
// The episode runner (rollout/episode_runner.h) sees an environment like any other, with
// the roles turned around: the agent's first request is the reset's observation (its
// messages rendered with the chat template), the runner's model turn is the answer to
// that request, and the agent's next request is the step's observation: the messages
// after the history it repeats (token-in/token-out: the turn's tokens are the ones
// sampled; only the new messages are rendered, as the template's delta). A session keeps
// each conversation it has had as a thread: a request continues the thread whose history
// it extends (the longest), resuming that thread's context in a new one when another
// thread came between (a parent after its sub-agent: EnvReply::resume_context); a request
// that extends none (an edited or compacted history, a sub-agent's first) opens a new
// context with its whole conversation. The agent's exit ends the episode:
// its reward is the last stdout line {"reward": x} or, failing that, the last POST to
// /v1/slimpi/reward; an exit without a reward, a non-zero exit, or no request within
// rollout.env_timeout_s fails that episode alone (status env_failed, infra).
//
// Requests that fail get the API's error object: 400 (malformed JSON or fields, a
// conversation the template cannot render), 401 (no valid token), 404 (an unknown or
// ended session, another model name), 413 (a body over rollout.agent_max_request_bytes,
// or a conversation over the episode's token budget), 429 (more than
// rollout.agent_max_session_requests requests of a session at once). A session's requests
// at once (sub-agents calling in parallel) are answered one after another, in the order
// they arrived: an episode is one sequence of model turns. Those still waiting when the
// agent exits get 404 and take no turn. An episode the runner stops at a limit (its turns,
// wall time or tokens: end()) answers the request in flight, and any later or waiting one,
// with 404 or 413, and waits for the agent's exit: its reward if it gives one, else 0 (said
// once), the episode truncated whatever its exit status.
//
// Threads: the runner's calls (reset, step, ended, end, close, poll, exclude_pause) come
// from the rollout rank's thread; requests arrive on the server's threads and wait there for their turn. Both
// meet in the session table under one mutex. Owned by the rollout rank (RolloutSide); its
// agents' process groups die with it (core/child_process.h).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "env/environment.h"

namespace slimpi {

struct HttpReply;
struct HttpRequest;
class HttpServer;

class AgentEnvironment : public Environment {
 public:
  explicit AgentEnvironment(const EnvConfig& cfg);
  ~AgentEnvironment() override;

  const EnvInfo& info() const override { return info_; }
  void reset(const EpisodeStart& start) override;
  void step(const EpisodeAction& action) override;
  void ended(const std::string& episode, EnvError error, const std::string& why) override;
  bool rewards_at_end() const override { return true; }
  void end(const std::string& episode, EnvError error, const std::string& why) override;
  void close(const std::string& episode) override;
  std::vector<EnvReply> poll(double wait_s) override;
  int64_t capacity() const override { return cfg_.agent_max_sessions; }
  void exclude_pause(double seconds) override;

  // http://<host>:<port> of this rank's endpoint (127.0.0.1 when it binds every interface).
  std::string base_url() const;

 private:
  struct Session;
  using Clock = std::chrono::steady_clock;
  // The server's threads.
  HttpReply serve(const HttpRequest& request);
  // A model turn asked for in either API (api: the Api enum of the .cpp, OpenAI or Anthropic).
  HttpReply converse(const HttpRequest& request, int api);
  HttpReply post_reward(const HttpRequest& request);
  // The runner's thread, under mu_: what a session has for the runner, if anything.
  void collect(Session& s, Clock::time_point now);
  // A request the runner waits for, as the reset's or the step's reply; nullopt when the
  // request is refused (a conversation the template cannot render: a 400) and the runner waits on.
  std::optional<EnvReply> observation(Session& s);
  // The agent has exited: the episode's last reply.
  EnvReply exit_reply(Session& s);
  void read_output(Session& s);

  EnvConfig cfg_;
  EnvInfo info_;
  std::string token_;
  std::mutex mu_;
  std::condition_variable arrived_;  // a request reached a session
  std::map<std::string, std::shared_ptr<Session>> sessions_;  // by session id
  std::map<std::string, std::string> session_of_;             // episode -> session id
  std::map<std::string, std::string> ended_;                  // recently ended session id -> why (for 404s)
  std::vector<EnvReply> ready_;
  bool stopping_ = false;
  bool said_no_reward_at_limit_ = false;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace slimpi
