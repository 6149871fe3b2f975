#include "env/agent_environment.h"

#include <signal.h>
#include <slimpi/error.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>
#include <optional>
#include <random>
#include <utility>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "agent/agent_token.h"
#include "agent/anthropic_messages.h"
#include "agent/http_server.h"
#include "agent/openai_chat.h"
#include "agent/openai_responses.h"
#include "core/child_process.h"
#include "core/log.h"
#include "core/stderr_log.h"

namespace slimpi {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kStdoutKept = 1 << 16;         // an agent's last stdout bytes (its reward line)
constexpr size_t kTaskBytes = 120 * 1024;       // below Linux's 128 KiB limit of one environment string
constexpr size_t kEndedRemembered = 1 << 14;    // ended sessions named in 404s

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// The APIs a session is served in: the request's form, its answer's and its errors'.
enum class Api { OpenAiChat, OpenAiResponses, AnthropicMessages };

// The routes of a model turn, one per API: its path under /v1, what its requests are
// called, and where its client takes the session's base URL from.
struct TurnRoute {
  const char* route;
  Api api;
  const char* what;
  const char* base_url;
};
constexpr TurnRoute kTurnRoutes[] = {
    {"chat/completions", Api::OpenAiChat, "chat completions",
     "OPENAI_BASE_URL as the agent was started with: .../s/<session>/v1"},
    {"responses", Api::OpenAiResponses, "responses", "OPENAI_BASE_URL as the agent was started with: .../s/<session>/v1"},
    {"messages", Api::AnthropicMessages, "messages",
     "ANTHROPIC_BASE_URL as the agent was started with: .../s/<session>"},
};

HttpReply error_reply(const ApiError& e, Api api = Api::OpenAiChat) {
  return {e.status, "application/json", api_error_body(e, api == Api::AnthropicMessages)};
}

HttpReply error_reply(int status, const std::string& type, const std::string& code, const std::string& message,
                      const std::string& param = "", Api api = Api::OpenAiChat) {
  return error_reply(api_error(status, type, code, message, param), api);
}

std::string random_hex(int bytes) {
  std::random_device rd;
  std::string s;
  for (int i = 0; i < bytes; ++i) s += fmt::format("{:02x}", rd() & 0xff);
  return s;
}

// What is wrong with a reward value ("" = nothing): it must be a number a float holds.
std::string bad_reward(const nlohmann::json& v) {
  if (!v.is_number()) return fmt::format("a {}, not a number", v.type_name());
  const double x = v.get<double>();
  if (!std::isfinite(x) || std::fabs(x) > double(std::numeric_limits<float>::max()))
    return fmt::format("{}, outside the range of a float", v.dump());
  return "";
}

// The reward in the last stdout line that is a JSON object with a "reward"; nullopt and
// *why set when that line's reward is not a usable number (or there is no such line).
std::optional<double> reward_line(const std::string& out, std::string* why) {
  size_t end = out.size();
  while (end > 0) {
    const size_t begin = out.rfind('\n', end - 1);
    const size_t from = begin == std::string::npos ? 0 : begin + 1;
    const nlohmann::json j = nlohmann::json::parse(out.substr(from, end - from), nullptr, false);
    if (j.is_object() && j.contains("reward")) {
      *why = bad_reward(j["reward"]);
      if (why->empty()) return j["reward"].get<double>();
      *why = "its last reward line gives " + *why;
      return std::nullopt;
    }
    if (begin == std::string::npos) break;
    end = begin;
  }
  return std::nullopt;
}

}  // namespace

struct AgentEnvironment::Session {
  std::string id, episode;
  std::unique_ptr<ChildProcess> agent;
  std::unique_ptr<StderrLog> err;
  std::string out_tail;  // its stdout's last kStdoutKept bytes
  int exit_status = 0;
  // Below: guarded by mu_.
  bool exited = false;                // (set by collect(), on the runner's thread, under mu_)
  bool runner_waits = false;          // reset() or step() sent: the runner waits for a reply
  Clock::time_point deadline;         // for the agent's next request, while the runner waits
  int64_t turns = 0;                  // model turns answered
  // A conversation of the session (docs/agents.md, "Threads"): a request that extends one
  // continues it; one that extends none begins another (an edited history, a sub-agent).
  struct Thread {
    std::vector<AgentMessage> history;  // its last request's messages and the turn that answered it
    std::vector<std::string> tools;     // its last request's tools
    bool instructions = false;          // history[0] is a Responses request's `instructions`
    int64_t context = 0;                // the episode's context its last turn was taken in (EpisodeAction::context)
    std::string last_response_id;       // its latest answer's, when that was a Responses request's
  };
  std::vector<Thread> threads;  // in the order they began
  size_t current = 0;           // the thread of the latest request
  std::optional<ChatCompletionRequest> incoming;  // arrived, not yet given to the runner
  bool incoming_instructions = false;             // its first message is a Responses request's instructions
  bool requested = false;                         // a request has come
  bool in_flight = false;                         // a server thread waits for this session's answer
  // Requests of the session at once (sub-agents calling in parallel) are answered one after
  // another in the order they arrived: each takes a ticket and waits for serving to reach it.
  uint64_t next_ticket = 0, serving = 0;
  int64_t queued = 0;  // requests holding a ticket, the one in flight included
  std::optional<AssistantTurn> answer;            // the model's turn, for the thread in flight
  std::optional<ApiError> refusal;                // or the error it returns
  std::optional<double> posted_reward;
  std::optional<ApiError> ending;  // stopped at a limit (end()): every request gets this; its exit awaited
  bool closed = false;
  std::condition_variable answered;  // answer, refusal, closed or ending set; or serving moved on
};

AgentEnvironment::AgentEnvironment(const EnvConfig& cfg) : cfg_(cfg) {
  SLIMPI_CHECK(!cfg_.agent_command.empty(), "rollout.environment = \"agent\" needs rollout.agent_command");
  signal(SIGPIPE, SIG_IGN);  // a client that hangs up must not kill the rank
  token_ = job_agent_token(cfg_.run_dir);
  info_.protocol_version = 1;
  info_.name = "agent";
  info_.max_concurrent_episodes = cfg_.agent_max_sessions;
  info_.token_details = true;  // (an agent's logprobs)
  // A thread for every request that may wait at once, up to max(sessions, 1024) (the pool's
  // threads all start now): past that, connections wait in the server's queue, and are
  // served as the runner answers the requests that hold threads (none needs another).
  const int64_t threads = std::min(cfg_.agent_max_sessions * cfg_.agent_max_session_requests,
                                   std::max<int64_t>(cfg_.agent_max_sessions, 1024)) + 8;
  server_ = std::make_unique<HttpServer>(cfg_.agent_host, int(cfg_.agent_port), token_, cfg_.agent_max_request_bytes,
                                         int(threads),
                                         [this](const HttpRequest& r) { return serve(r); });
  log::all("agent endpoint: {}/v1 (sessions under {}/s/<session>/v1; token in {})", base_url(), base_url(),
           agent_token_path(cfg_.run_dir));
}

AgentEnvironment::~AgentEnvironment() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& [id, s] : sessions_) s->answered.notify_all();
  }
  // The agents first: their connections close with them, so the server's threads do not sit
  // out their keep-alive time.
  for (auto& [id, s] : sessions_)
    if (s->agent) {
      s->err->drain(*s->agent, /*final=*/true);
      s->agent.reset();
    }
  server_.reset();  // waits for the requests in flight, which stopping_ has let go
}

std::string AgentEnvironment::base_url() const {
  // The agents run on this node: an endpoint on every interface is reached on the loopback's.
  const std::string& h = cfg_.agent_host;
  const std::string host = h == "0.0.0.0" ? "127.0.0.1" : h == "::" ? "[::1]"
                           : h.find(':') != std::string::npos ? "[" + h + "]" : h;
  return fmt::format("http://{}:{}", host, server_->port());
}

void AgentEnvironment::reset(const EpisodeStart& start) {
  auto s = std::make_shared<Session>();
  s->id = random_hex(12);
  s->episode = start.episode;
  const std::string session_url = base_url() + "/s/" + s->id;
  // The task as the data file gives it, not rendered: the agent renders its own conversation.
  const std::string& task = start.prompt_raw.empty() ? start.prompt : start.prompt_raw;
  const size_t task_bytes = task.size() + start.label.size() + start.metadata_json.size();
  std::vector<std::string> env;
  if (task_bytes <= kTaskBytes)
    env = {
        "OPENAI_BASE_URL=" + session_url + "/v1",
        "OPENAI_API_KEY=" + token_,
        "ANTHROPIC_BASE_URL=" + session_url,
        "ANTHROPIC_API_KEY=" + token_,
        "SLIMPI_MODEL=" + cfg_.agent_model,
        "SLIMPI_SESSION=" + s->id,
        "SLIMPI_REWARD_URL=" + session_url + "/v1/slimpi/reward",
        "SLIMPI_EPISODE=" + start.episode,
        "SLIMPI_SEED=" + std::to_string(start.seed),
        "SLIMPI_PROMPT=" + task,
        "SLIMPI_LABEL=" + start.label,
        "SLIMPI_METADATA=" + (start.metadata_json.empty() ? std::string("null") : start.metadata_json),
        // Not the rank's MPI: a tool the agent runs under MPI must not join the job.
        "OMPI_*", "PMIX_*", "PRTE_*", "PMI_*", "HYDRA_*",
    };
  {  // the session exists before its agent can call in
    std::lock_guard<std::mutex> lock(mu_);
    sessions_[s->id] = s;
    session_of_[start.episode] = s->id;
    if (task_bytes > kTaskBytes) {
      EnvReply r;
      r.episode = start.episode;
      r.failed = true;
      r.message = fmt::format("its prompt record ({} bytes) is too long to pass to the agent in SLIMPI_PROMPT, "
                              "SLIMPI_LABEL and SLIMPI_METADATA (at most {} bytes)", task_bytes, kTaskBytes);
      ready_.push_back(std::move(r));
      return;
    }
    s->runner_waits = true;
    s->deadline = Clock::now() + seconds(cfg_.timeout_s);
  }
  // collect() (this thread) skips a session until its agent is set; the server's threads never touch it.
  auto agent = std::make_unique<ChildProcess>(
      command_under_limits(cfg_.agent_command, cfg_.cpu_limit_s, cfg_.memory_limit_mb), /*capture_stderr=*/true, env);
  agent->close_stdin();
  s->err = std::make_unique<StderrLog>("agent " + start.episode, cfg_.max_stderr_bytes, "rollout.env_max_stderr_bytes");
  s->agent = std::move(agent);
}

void AgentEnvironment::step(const EpisodeAction& action) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = session_of_.find(action.episode);
  SLIMPI_CHECK(it != session_of_.end(), "agent: episode {} has no session", action.episode);
  Session& s = *sessions_.at(it->second);
  AssistantTurn turn = assistant_turn({action.text, action.tool_calls, action.finish_reason, action.turn,
                                       action.context_tokens, int64_t(action.token_ids.size()), &action.token_texts,
                                       &action.log_probs},
                                      cfg_.chat.chat_template);
  Session::Thread& thread = s.threads.at(s.current);
  thread.history.push_back(as_message(turn));
  thread.context = action.context;
  ++s.turns;
  s.answer = std::move(turn);
  s.runner_waits = true;
  s.deadline = Clock::now() + seconds(cfg_.timeout_s);
  s.answered.notify_all();
}

namespace {

// What a request of an episode stopped by the runner gets: 413 for a conversation over
// the episode's tokens, else 404 (the session is over).
ApiError episode_over(EnvError error, const std::string& why) {
  if (error == EnvError::Overlong)
    return api_error(413, "invalid_request_error", "context_length_exceeded",
                     "the conversation is over this episode's context: " + why);
  return api_error(404, "not_found_error", "session_ended",
                   "the episode has ended" + (why.empty() ? std::string() : ": " + why));
}

}  // namespace

void AgentEnvironment::ended(const std::string& episode, EnvError error, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = session_of_.find(episode);
  if (it == session_of_.end()) return;
  Session& s = *sessions_.at(it->second);
  if (!s.in_flight || s.answer || s.refusal) return;
  s.refusal = episode_over(error, why);
  s.answered.notify_all();
}

void AgentEnvironment::end(const std::string& episode, EnvError error, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = session_of_.find(episode);
  SLIMPI_CHECK(it != session_of_.end(), "agent: episode {} has no session", episode);
  Session& s = *sessions_.at(it->second);
  s.ending = episode_over(error, why + "; exit with your reward");
  if (s.in_flight && !s.answer && !s.refusal) s.refusal = s.ending;
  s.answered.notify_all();
  s.runner_waits = true;  // for the agent's exit
  s.deadline = Clock::now() + seconds(cfg_.timeout_s);
}

void AgentEnvironment::close(const std::string& episode) {
  std::shared_ptr<Session> s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = session_of_.find(episode);
    if (it == session_of_.end()) return;
    s = sessions_.at(it->second);
    sessions_.erase(it->second);
    session_of_.erase(it);
    if (ended_.size() >= kEndedRemembered) ended_.clear();
    ended_[s->id] = episode;
    s->closed = true;
    s->answered.notify_all();
  }
  if (s->agent) {
    s->err->drain(*s->agent, /*final=*/!s->exited);  // an agent cut short: its last words
    s->agent.reset();  // kills what is left of its process group
  }
}

void AgentEnvironment::exclude_pause(double secs) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, s] : sessions_) s->deadline += seconds(secs);
}

void AgentEnvironment::read_output(Session& s) {
  if (!s.agent) return;
  char buf[8192];
  for (int chunk = 0; chunk < 64 && s.agent->stdout_fd() >= 0; ++chunk) {  // bounded: a flooding agent cannot hold us
    const ssize_t n = ::read(s.agent->stdout_fd(), buf, sizeof(buf));
    if (n == 0) s.agent->close_stdout();
    if (n <= 0) break;
    s.out_tail.append(buf, size_t(n));
    if (s.out_tail.size() > 2 * kStdoutKept) s.out_tail.erase(0, s.out_tail.size() - kStdoutKept);
  }
  s.err->drain(*s.agent);
}

std::vector<EnvReply> AgentEnvironment::poll(double wait_s) {
  std::unique_lock<std::mutex> lock(mu_);
  auto request_waiting = [&] {
    for (auto& [id, s] : sessions_)
      if (s->runner_waits && s->incoming) return true;
    return !ready_.empty();
  };
  if (wait_s > 0 && !request_waiting()) arrived_.wait_for(lock, std::chrono::duration<double>(wait_s));
  const Clock::time_point now = Clock::now();
  for (auto& [id, s] : sessions_) collect(*s, now);
  std::vector<EnvReply> out;
  out.swap(ready_);
  return out;
}

void AgentEnvironment::collect(Session& s, Clock::time_point now) {
  if (!s.agent) return;
  read_output(s);
  if (!s.exited && s.agent->wait_until(now, &s.exit_status)) {
    s.exited = true;
    read_output(s);
    s.answered.notify_all();  // its requests still waiting for their turn leave with a 404
  }
  if (!s.runner_waits) return;
  if (s.incoming && s.exited) {  // a request of an agent that has exited since: nobody reads its answer
    s.incoming.reset();
    s.refusal = api_error(404, "not_found_error", "session_ended", "the agent has exited");
    s.answered.notify_all();
    return;
  }
  if (s.incoming) {
    if (std::optional<EnvReply> r = observation(s)) {
      ready_.push_back(std::move(*r));
      s.runner_waits = false;
    }
    return;
  }
  if (s.exited && !s.in_flight) {
    ready_.push_back(exit_reply(s));
    s.runner_waits = false;
  } else if (now > s.deadline) {
    EnvReply r;
    r.episode = s.episode;
    r.failed = true;
    r.message = fmt::format("its agent neither sent its next request nor exited within rollout.env_timeout_s = {} s",
                            cfg_.timeout_s);
    ready_.push_back(std::move(r));
    s.runner_waits = false;
  }
}

std::optional<EnvReply> AgentEnvironment::observation(Session& s) {
  ChatCompletionRequest req = std::move(*s.incoming);
  s.incoming.reset();
  std::vector<ChatMessage> whole;
  const std::string why = conversation_messages(req.messages, req.tools, cfg_.chat, &whole);
  EnvReply r;
  r.episode = s.episode;
  if (!why.empty()) {  // the agent's mistake: its request fails, the episode waits for another
    s.refusal = invalid_request("messages", why);
    s.answered.notify_all();  // (the deadline stands: an agent that keeps sending bad requests times out)
    return std::nullopt;
  }
  // The thread the request continues: of those whose history it extends with messages
  // that are not the assistant's, the longest (the latest request's thread on a tie).
  auto extends = [&](const Session::Thread& t) {
    const size_t h = t.history.size();
    bool yes = h > 0 && req.messages.size() > h && req.tools == t.tools;
    for (size_t i = 0; yes && i < h; ++i) yes = req.messages[i].same_as(t.history[i]);
    for (size_t i = h; yes && i < req.messages.size(); ++i) yes = req.messages[i].role != "assistant";
    return yes;
  };
  std::optional<size_t> thread;
  for (size_t k = 0; s.turns > 0 && k < s.threads.size(); ++k) {
    if (!extends(s.threads[k])) continue;
    const size_t h = s.threads[k].history.size(), best = thread ? s.threads[*thread].history.size() : 0;
    if (!thread || h > best || (h == best && k == s.current)) thread = k;
  }
  if (s.turns == 0) {
    r.messages = std::move(whole);  // the reset's context
    s.threads.assign(1, {});
    s.current = 0;
  } else if (thread) {
    const size_t n = req.messages.size() - s.threads[*thread].history.size();  // the new messages: the last n rendered
    r.messages.assign(whole.end() - std::ptrdiff_t(n), whole.end());
    r.conversation = std::move(whole);
    if (*thread != s.current) {  // back to a thread left for another: its context continued in a new one
      r.new_context = true;
      r.resume_context = s.threads[*thread].context;
      s.current = *thread;
    }
  } else {  // an edited history, or another agent's: the whole conversation as a new context
    r.new_context = true;
    r.messages = std::move(whole);
    s.threads.emplace_back();
    s.current = s.threads.size() - 1;
  }
  Session::Thread& t = s.threads[s.current];
  t.history = std::move(req.messages);
  t.instructions = s.incoming_instructions;
  t.tools = std::move(req.tools);
  return r;
}

EnvReply AgentEnvironment::exit_reply(Session& s) {
  EnvReply r;
  r.episode = s.episode;
  r.failed = true;
  const int st = s.exit_status;
  const bool exited = WIFEXITED(st);
  if (s.ending) {  // stopped at a limit: an unmodified client raises on its 404 / 413, and the episode still trains
    std::string why;
    std::optional<double> reward = reward_line(s.out_tail, &why);
    if (!reward && why.empty()) reward = s.posted_reward;
    r.failed = false;
    r.done = true;
    r.reward = reward.value_or(0.0);
    if (!reward && !std::exchange(said_no_reward_at_limit_, true))
      log::warn("episode {}: its agent, stopped at a limit, ended ({}) without a reward{}: its reward is 0. Said once",
                s.episode, ChildProcess::describe_status(st), why.empty() ? "" : " (" + why + ")");
    return r;
  }
  if (exited && (WEXITSTATUS(st) == 126 || WEXITSTATUS(st) == 127) && !s.requested)  // sh: cannot run it
    SLIMPI_FAIL("rollout.agent_command '{}' cannot be run ({}: sh's status for a command not found or not "
                "executable; its stderr is in the log)", cfg_.agent_command, ChildProcess::describe_status(st));
  if (!exited || WEXITSTATUS(st) != 0) {
    r.message = fmt::format("its agent ended with {} (its stderr is in the log, \"[agent {} stderr]\")",
                            ChildProcess::describe_status(st), s.episode);
    return r;
  }
  if (!s.requested) {
    r.message = "its agent exited (status 0) before its first request: an episode needs at least one model turn";
    return r;
  }
  std::string why;
  std::optional<double> reward = reward_line(s.out_tail, &why);
  if (!reward && why.empty()) reward = s.posted_reward;
  if (!reward) {
    r.message = why.empty() ? "its agent exited (status 0) without a reward: print {\"reward\": x} as a line on its "
                              "stdout, or POST {\"reward\": x} to $SLIMPI_REWARD_URL, before it exits"
                            : why;
    return r;
  }
  r.failed = false;
  r.done = true;
  r.reward = *reward;
  return r;
}

HttpReply AgentEnvironment::serve(const HttpRequest& request) {
  for (const TurnRoute& t : kTurnRoutes) {
    if (request.route != t.route) continue;
    if (request.method != "POST")
      return error_reply(405, "invalid_request_error", "method_not_allowed", fmt::format("use POST /v1/{}", t.route), "",
                         t.api);
    if (request.session.empty())
      return error_reply(404, "not_found_error", "session_required",
                         fmt::format("{} are served under a session's base URL ({})", t.what, t.base_url), "", t.api);
    return converse(request, int(t.api));
  }
  if (request.route == "slimpi/reward" && request.method == "POST") return post_reward(request);
  if (request.route == "models" || request.route == "models/" + cfg_.agent_model) {
    const nlohmann::json model = {{"id", cfg_.agent_model}, {"object", "model"}, {"created", 0}, {"owned_by", "slimpi"}};
    const nlohmann::json body = request.route == "models" ? nlohmann::json{{"object", "list"}, {"data", {model}}} : model;
    return {200, "application/json", body.dump()};
  }
  if (request.route.rfind("models/", 0) == 0)
    return error_reply(404, "invalid_request_error", "model_not_found",
                       fmt::format("the model '{}' does not exist; this endpoint serves '{}' (rollout.agent_model)",
                                   request.route.substr(7), cfg_.agent_model));
  return error_reply(404, "not_found_error", "", fmt::format("no route {} /v1/{} (served: POST /v1/chat/completions, POST /v1/responses, POST "
                                                             "/v1/messages, GET /v1/models, POST /v1/slimpi/reward)", request.method,
                                                             request.route));
}

HttpReply AgentEnvironment::converse(const HttpRequest& request, int api_index) {
  const Api api = Api(api_index);
  auto error = [api](int status, const std::string& type, const std::string& code, const std::string& message,
                     const std::string& param = "") { return error_reply(status, type, code, message, param, api); };
  ResponsesRequest responses;  // (Responses only)
  ChatCompletionRequest& req = responses.chat;
  if (std::optional<ApiError> e = api == Api::AnthropicMessages ? parse_anthropic_messages(request.body, &req)
                                  : api == Api::OpenAiResponses ? parse_responses_request(request.body, &responses)
                                                                : parse_chat_completion(request.body, &req))
    return error_reply(*e, api);
  std::unique_lock<std::mutex> lock(mu_);
  auto it = sessions_.find(request.session);
  if (it == sessions_.end() || stopping_) {
    auto gone = ended_.find(request.session);
    return error(404, "not_found_error", "session_not_found",
                       gone != ended_.end() ? fmt::format("session {} (episode {}) has ended", request.session, gone->second)
                                            : fmt::format("no session {} on this endpoint", request.session));
  }
  if (req.model != cfg_.agent_model)
    return error(404, "invalid_request_error", "model_not_found",
                       fmt::format("the model '{}' does not exist; this endpoint serves '{}' (rollout.agent_model)",
                                   req.model, cfg_.agent_model),
                       "model");
  std::shared_ptr<Session> s = it->second;
  if (s->ending) return error_reply(*s->ending, api);
  // The stored conversation, then the input: looked up as the request arrives (a response's
  // conversation never changes; a later answer of its thread makes it no thread's latest).
  if (!responses.previous_response_id.empty()) {
    const auto named = std::find_if(s->threads.begin(), s->threads.end(), [&](const Session::Thread& t) {
      return t.last_response_id == responses.previous_response_id;
    });
    if (named == s->threads.end())
      return error(400, "invalid_request_error", "previous_response_not_found",
                   fmt::format("previous_response_id '{}' is not the latest response of any of this session's "
                               "conversations: only each one's latest is stored", responses.previous_response_id),
                   "previous_response_id");
    // OpenAI does not carry the earlier request's instructions over; this request's come first.
    const Session::Thread& latest = *named;
    const ptrdiff_t own = responses.has_instructions ? 1 : 0, stored = latest.instructions ? 1 : 0;
    std::vector<AgentMessage> whole(req.messages.begin(), req.messages.begin() + own);
    whole.insert(whole.end(), latest.history.begin() + stored, latest.history.end());
    whole.insert(whole.end(), req.messages.begin() + own, req.messages.end());
    req.messages = std::move(whole);
  }
  if (s->queued >= cfg_.agent_max_session_requests)
    return error(429, "rate_limit_error", "session_busy",
                 fmt::format("this session has {} requests being answered or waiting for their turn: at most "
                             "rollout.agent_max_session_requests = {} at once (an episode's model turns are taken one "
                             "after another)",
                             s->queued, cfg_.agent_max_session_requests));
  // Wait for this request's turn. Whatever way it leaves from here, the next in line goes on
  // (the guard, destroyed while mu_ is still held). ending, closed and stopping_ are never
  // undone, so a request that leaves before its turn is followed by every later one.
  const uint64_t ticket = s->next_ticket++;
  ++s->queued;
  struct NextInLine {
    Session& s;
    uint64_t ticket;
    ~NextInLine() {
      --s.queued;
      if (s.serving == ticket) ++s.serving;
      s.answered.notify_all();
    }
  } next_in_line{*s, ticket};
  s->answered.wait(lock, [&] { return s->serving == ticket || s->ending || s->closed || s->exited || stopping_; });
  if (s->ending) return error_reply(*s->ending, api);
  if (s->serving != ticket || s->exited)  // the session closed, its agent exited, or the job ends, before its turn
    return error(404, "not_found_error", "session_ended",
                 stopping_   ? std::string("the job is ending")
                 : s->exited ? fmt::format("episode {} has ended: its agent has exited", s->episode)
                             : fmt::format("episode {} has ended", s->episode));
  const bool stream = req.stream, include_usage = req.include_usage, logprobs = req.logprobs;
  const bool instructions = responses.has_instructions;
  s->in_flight = true;
  s->requested = true;
  s->answer.reset();
  s->refusal.reset();
  s->incoming = std::move(req);
  s->incoming_instructions = instructions;
  arrived_.notify_all();
  s->answered.wait(lock, [&] { return s->answer || s->refusal || s->closed || stopping_; });
  s->in_flight = false;
  if (s->answer) {
    const AssistantTurn turn = std::move(*s->answer);
    s->answer.reset();
    std::string& response_id = s->threads.at(s->current).last_response_id;  // (the thread just answered)
    response_id.clear();  // (a previous_response_id names a thread's latest answer only, in any API)
    if (api == Api::AnthropicMessages) {
      const std::string id = fmt::format("msg_{}_{}", s->id, s->turns);
      if (stream) return {200, "text/event-stream", anthropic_message_events(turn, id, cfg_.agent_model)};
      return {200, "application/json", anthropic_message_json(turn, id, cfg_.agent_model)};
    }
    const int64_t created = int64_t(std::time(nullptr));
    if (api == Api::OpenAiResponses) {
      const std::string id = fmt::format("resp_{}_{}", s->id, s->turns);
      response_id = id;
      if (stream) return {200, "text/event-stream", response_events(turn, id, cfg_.agent_model, created, logprobs)};
      return {200, "application/json", response_json(turn, id, cfg_.agent_model, created, logprobs)};
    }
    const std::string id = fmt::format("chatcmpl-{}-{}", s->id, s->turns);
    if (stream)
      return {200, "text/event-stream",
              chat_completion_events(turn, id, cfg_.agent_model, created, include_usage, logprobs)};
    return {200, "application/json", chat_completion_json(turn, id, cfg_.agent_model, created, logprobs)};
  }
  if (s->refusal) {
    const ApiError e = *s->refusal;
    s->refusal.reset();
    return error_reply(e, api);
  }
  s->incoming.reset();
  return error(404, "not_found_error", "session_ended",
                     stopping_ ? "the job is ending" : fmt::format("episode {} has ended", s->episode));
}

HttpReply AgentEnvironment::post_reward(const HttpRequest& request) {
  if (request.session.empty())
    return error_reply(404, "not_found_error", "session_required",
                       "a reward is POSTed to its session's URL ($SLIMPI_REWARD_URL as the agent was started with)");
  const nlohmann::json j = nlohmann::json::parse(request.body, nullptr, false);
  if (!j.is_object() || !j.contains("reward"))
    return error_reply(400, "invalid_request_error", "", "the body must be {\"reward\": <number>}", "reward");
  if (const std::string why = bad_reward(j["reward"]); !why.empty())
    return error_reply(400, "invalid_request_error", "", "the reward is " + why, "reward");
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(request.session);
  if (it == sessions_.end())
    return error_reply(404, "not_found_error", "session_not_found", fmt::format("no open session {}", request.session));
  it->second->posted_reward = j["reward"].get<double>();
  return {200, "application/json", R"({"ok": true})"};
}

}  // namespace slimpi
