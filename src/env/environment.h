// Environment — what a multi-turn episode talks to: the rollout's side of the
// environment protocol (docs/environments.md). An episode is reset once, then stepped
// with each model turn until a reply says done or truncated (or a limit ends it), then
// closed. Calls are asynchronous: reset() and step() queue a request, poll() returns
// the replies that have arrived, in any order, so one rank's engine keeps decoding while
// environments think. Every request gets exactly one reply: the environment's, or one
// with `failed` set that says what went wrong (a crashed, hung, lying or flooding
// process; the episode ends, the process is restarted, nothing else is lost).
// Two kinds, one registry keyed by rollout.environment (environments()):
//   command     external processes that speak JSON lines (env/command_environment.h)
//   calculator  the built-in in-process calculator tool (env/calculator_environment.cpp)
// Owned by one rollout rank's RolloutSide for the whole run; single-threaded.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/registry.h"
#include "env/env_config.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tool_calls.h"

namespace slimpi {

// Stored as int8 per sample in rollouts.h5 (env_error; attribute env_error_names).
enum class EnvError : int8_t {
  None = 0,
  Model = 1,     // the model's action was unusable (a malformed tool call, no answer)
  Tool = 2,      // a tool failed
  Infra = 3,     // the environment failed: crashed, hung, answered garbage (the episode is not trained)
  Overlong = 4,  // an observation or the episode outgrew its token limits
};
const char* env_error_name(EnvError e);
// "model" -> Model ...; false for an unknown name.
bool parse_env_error(const std::string& name, EnvError* out);

// What the environment says about itself (the handshake).
struct EnvInfo {
  int64_t protocol_version = 0;
  std::string name;
  std::string tools_json = "[]";  // OpenAI function schemas
  int64_t max_concurrent_episodes = 1;
  bool deterministic = false;
  // Every observation carries the episode's state ("snapshot"), and restore() brings an
  // episode back from one: episodes in flight at a checkpoint resume without a replay.
  bool snapshots = false;
  // The actions carry each sampled token's text and log-prob (token_texts, log_probs: an
  // agent's logprobs); without it the runner leaves them empty.
  bool token_details = false;
};
// "'calc' (protocol 1, 4 concurrent episodes a process, deterministic, no snapshots)":
// what the job log says of an environment once it has said hello.
std::string describe_env_info(const EnvInfo& info);

struct EpisodeStart {
  std::string episode;  // unique for the run: "<stream>/<group>/<sample>"
  int64_t step = 0, group = 0, sample = 0;
  uint64_t seed = 0;
  std::string prompt, label, metadata_json;  // metadata_json "" = none
  std::string prompt_raw;  // the record's prompt as the file holds it (Prompt::raw): what an agent gets
  int64_t max_turns = 0, max_total_tokens = 0;
  double wall_time_s = 0;
};

struct EpisodeAction {
  std::string episode;
  int64_t turn = 0;  // 1 for the first model turn
  std::string text;
  std::vector<int64_t> token_ids;
  std::vector<ToolCall> tool_calls;
  std::string finish_reason;  // "stop" (a stop token or string), "length" (the turn's token limit)
  int64_t context_tokens = 0;  // tokens of the sequence the turn continued (its latest context's)
  int64_t context = 0;         // the context it was taken in: 0 the reset's, k the k-th opened since
  // The tokens behind `text` (token_ids without the stop token), each alone: its bytes and
  // its log-probability under the rollout's sampling (the sample's rollout_log_probs).
  std::vector<std::string> token_texts;
  std::vector<float> log_probs;
};

struct EnvReply {
  std::string episode;
  bool failed = false;  // slimpi's verdict: no usable reply (message says why); the episode ends
  std::vector<ChatMessage> messages;  // the observation as messages (appended through the chat template)
  std::vector<int64_t> token_ids;     // or as token ids (appended as they are); both: messages first
  double reward = 0;                   // a number, or the sum of named parts
  std::map<std::string, double> reward_parts;
  bool done = false, truncated = false;
  // The observation opens a new context: the model sees it alone from here on (the
  // environment managing the context: a summary, a sub-agent's task), not appended.
  bool new_context = false;
  // With new_context: the new context continues an earlier one (a thread the episode left
  // for another, such as a parent agent after its sub-agent): it opens with that context's
  // tokens as they are, then `messages` as the chat template's delta after its last turn.
  // The finished sample keeps the two as one context (rollout/context_threads.h). -1: none.
  int64_t resume_context = -1;
  // The whole conversation the observation ends, when the environment has it (an agent's
  // request): should the chat template not continue the stream with `messages` (it
  // rewrites the history), the episode opens a new context with it instead of ending the job.
  std::vector<ChatMessage> conversation;
  EnvError error = EnvError::None;
  std::string message;  // the error's text
  std::map<std::string, double> metrics;
  std::string snapshot;   // the episode's state after this reply, as JSON text ("": none given)
  bool restored = false;  // the answer to restore(): the episode is back, waiting for its next step
};

class Environment {
 public:
  virtual ~Environment() = default;
  virtual const EnvInfo& info() const = 0;
  virtual void reset(const EpisodeStart& start) = 0;
  virtual void step(const EpisodeAction& action) = 0;
  virtual void close(const std::string& episode) = 0;  // no reply
  // Why the runner ended an open episode, just before close() (the reply's own done or
  // truncated included): an environment that owes its client an answer says so.
  virtual void ended(const std::string& /*episode*/, EnvError /*error*/, const std::string& /*why*/) {}
  // An environment whose episodes get their reward with their last reply (an agent's
  // exit): the runner stops such an episode at its limits (turns, wall time, tokens) with
  // end() and waits for that last reply (done with the reward, or failed), instead of
  // closing it with no reward. end() tells the client why (the request in flight fails).
  virtual bool rewards_at_end() const { return false; }
  virtual void end(const std::string& /*episode*/, EnvError /*error*/, const std::string& /*why*/) {}
  // Opens `start.episode` again from `snapshot` (an observation's, after `turns` model
  // turns) in place of a reset; the reply has `restored` set. Only where info().snapshots.
  virtual void restore(const EpisodeStart& start, int64_t turns, const std::string& snapshot);
  // Replies that arrived; waits up to wait_s for the first when none is ready.
  virtual std::vector<EnvReply> poll(double wait_s) = 0;
  // Episodes this environment can hold at once (further resets are queued by the caller).
  virtual int64_t capacity() const = 0;
  // Process restarts so far (0 for in-process environments).
  virtual int64_t restarts() const { return 0; }
  // The caller did not poll for `seconds` (a paused stream under full async): the
  // outstanding requests' time limits move forward by it.
  virtual void exclude_pause(double /*seconds*/) {}
};

// vocab_size: the policy's vocabulary (an observation's token ids must be in it).
using EnvFactory = std::function<std::unique_ptr<Environment>(const EnvConfig&, int64_t vocab_size)>;
// rollout.environment's choices: "none" (single-turn rollouts; a null factory), "command", "calculator".
const Registry<EnvFactory>& environments();

}  // namespace slimpi
