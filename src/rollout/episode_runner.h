// EpisodeRunner — multi-turn rollouts on one engine rank (rollout.environment): each
// sample of a group is an episode with the environment (env/environment.h), run as one
// growing token sequence in the engine (token-in / token-out).
//
// An episode: reset (the environment's first observation, or the prompt as it is) ->
// model turn (the engine continues the sequence from its next position, stopping at a
// stop token, a stop string such as </tool_call>, or rollout.max_new_tokens new tokens)
// -> step (the turn's text, token ids and parsed tool calls) -> the reply's
// observation appended as the chat template's delta, tokenised once
// (tokenizer/chat_transcript.h) -> the next model turn ... until the environment says
// done or truncated, or a limit ends it (rollout.env_max_turns, env_max_total_tokens,
// env_max_observation_tokens, env_episode_wall_s, the model's context).
// Invariants of the sample an episode returns: tokens = context + every turn and
// observation in order; the model's tokens are exactly the ones it sampled, with their
// log-probs and weight versions, loss_mask 1; observation tokens have loss_mask 0,
// log-prob 0 and the engine's weight version. The KV cache carries across turns through
// the prefix cache (rollout.cache_responses is on with an environment). Sampling stays
// a function of (group seed, sample, position): the same deck gives the same episodes
// with any number of engines, when the environment is deterministic.
// Failures: a failed reply (env/command_environment.h) ends the episode with status
// EnvFailed and EnvError::Infra (the router keeps its group out of training); with
// rollout.env_fail_job the job ends instead, naming the episode. An over-long
// observation ends it Truncated with EnvError::Overlong. A chat template that rewrites
// history ends the job (a configuration error, not an episode's).
// Across weight updates and checkpoints (train.async = "full"): the streaming router
// keeps one runner for the run. An episode's turn in the engine is parked and continued
// like any partial sample (rollout.partial = "continue"); snapshot() gives every open
// episode as a WorkItem (its trajectory, turns and prompt record). add_work() of such an
// item, on any engine, resumes it: with an environment that declares itself
// deterministic, a fresh episode is reset with the same seed and sent the recorded
// turns again, each reply checked against the recorded observation token for token
// (a difference fails the episode: EnvFailed, infra), then the open turn, if any,
// continues in the engine from its recorded tokens; the result is the recorded
// trajectory bit for bit, continued. With an environment that takes snapshots
// (EnvInfo::snapshots) the item also holds the environment's state after the episode's
// last reply, its chat transcript and rewards: the episode is restored from them (one
// restore request, no replay; preferred when an environment is both), then its turn under
// way continues, or its last turn, whose reply the checkpoint did not hold, is sent again.
// Otherwise the episode starts again from its reset (said once per runner).
// Built per generate() call by RolloutSide over its engine and environment, or once per
// run for the stream; single-threaded. Three files: the state machine (episode_runner.cpp:
// NotStarted -> Reset or Restore -> Turn <-> Step -> finished), resume and replay
// (episode_resume.cpp) and the trajectory's views (episode_trajectory.cpp); an open
// episode's state is rollout/episode.h.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/prompt_source.h"
#include "core/timer.h"
#include "env/environment.h"
#include "rollout/engine.h"
#include "rollout/group_worker.h"

namespace slimpi {

struct EpisodeSettings {
  EnvConfig env;
  ChatFormat chat;
  int64_t max_turn_tokens = 64;  // rollout.max_new_tokens
  uint64_t stream = 0;           // names episodes ("<stream>/<group>/<sample>"); the reset's step
};

// Where an episode's turn whose context the runner's engine would compute from its start
// goes instead (EpisodeRunner::set_context_prefill): under rollout.prefill_ranks a prefill
// engine computes the context's KV, and the turn reaches the runner's engine with it
// (Engine::add_prefilled; rollout/disaggregated_episodes.h).
class ContextPrefill {
 public:
  virtual ~ContextPrefill() = default;
  // `turn`: the engine's work for the turn (never a group).
  virtual void submit(const WorkItem& turn) = 0;
};

class EpisodeRunner : public GroupWorker {
 public:
  // prompts[g - first_group] is group g's record (add_request); the stream's runner
  // gets none: its work items carry their records (add_work).
  EpisodeRunner(Engine& engine, Environment& env, const Tokenizer& tokenizer, const EpisodeSettings& settings,
                const std::vector<Prompt>& prompts, int64_t first_group);
  ~EpisodeRunner() override;

  void add_request(const GenerationRequest& request) override;
  bool has_work() const override;
  std::vector<Sample> step() override;

  // A group of episodes, or one episode to resume (see above); item.record is required.
  void add_work(const WorkItem& item);
  // Every open episode as a WorkItem, for a checkpoint. `turns`: the engine's work in
  // flight, parked or not (the open turns' tokens so far).
  std::vector<WorkItem> snapshot(const std::vector<WorkItem>& turns) const;
  // The stream between runs (weight sync, evaluation, a checkpoint): pause() when a run
  // ends, resume() when the next begins; the time between counts neither towards the
  // environment's time limits nor towards the episodes' clocks (env_s, episode_s,
  // rollout.env_episode_wall_s). resume() also says the failures since the last pause
  // that were not warned of one by one.
  void pause();
  void resume();
  // The turns whose context the engine would compute from its start go to `prefill` (null:
  // to the engine): a turn that opens a context (but one that resumes an earlier thread,
  // whose tokens the engine's prefix cache normally holds), and every turn of an engine
  // that keeps no prefix cache (a hybrid model's). The other turns run on the engine, whose
  // prefix cache normally holds their context.
  void set_context_prefill(ContextPrefill* prefill) { context_prefill_ = prefill; }

 private:
  struct Episode;
  Episode& add_episode(const GenerationRequest& request, const Prompt& prompt, int64_t index);
  void start_waiting_episodes();
  // A resumed episode whose environment answered otherwise than recorded.
  void diverged(Episode& e, const std::string& why);
  // The failures beyond the first kFailuresSaid since the last call, summed up in one warning.
  void say_unsaid_failures();
  // The state machine (episode_runner.cpp). A reply: accepted (false: it ended the
  // episode or restored it), then the reset's context or the observation after a turn.
  void on_reply(Episode& e, const EnvReply& reply);
  bool accept_reply(Episode& e, const EnvReply& reply);
  void on_reset(Episode& e, const EnvReply& reply);
  void on_observation(Episode& e, const EnvReply& reply);
  // The episode reached one of its limits after a reply: truncated here, or, with an
  // environment that gives its reward at the end, ended there and its last reply awaited.
  void stop_at_limit(Episode& e, EnvError error, const std::string& why);
  // That last reply: the episode is truncated with the reward it gives.
  void on_ending(Episode& e, const EnvReply& reply);
  // The observation's tokens: a new context rendered alone, or the transcript's delta and
  // the reply's token ids; false when it ended the episode. *new_context: they open a new
  // context (asked for, or the reply's whole conversation where the template rewrites history).
  bool observation_tokens(Episode& e, const EnvReply& reply, std::vector<int64_t>* out, bool* new_context);
  // A new context that resumes an earlier one (reply.resume_context): that context's tokens,
  // then the delta after its last turn, rendered through the transcript it was left with
  // (set aside in e.resumed_transcript); false when it ended the episode.
  bool resumed_context_tokens(Episode& e, const EnvReply& reply, std::vector<int64_t>* out);
  // The reply's whole conversation (an agent's request) rendered as a context of its own,
  // where the chat template does not continue the episode with its messages (`why`).
  std::vector<int64_t> whole_conversation(const Episode& e, const EnvReply& reply, const std::string& why) const;
  // Context k's tokens as the model saw them (the first context's begin with the prompt),
  // and how many.
  static std::vector<int64_t> context_of(const Sample& s, int64_t k);
  static int64_t context_length(const Sample& s, int64_t k);
  // The response tokens that copy resumed contexts, from e.continued_from: the finished
  // sample keeps them once, so the episode's limits count its trajectory without them.
  static int64_t copied_tokens(const Episode& e);
  void on_turn(Episode& e, Sample&& turn);
  void begin_turn(Episode& e);
  // The engine takes the turn that began at response offset `start` (its tokens after
  // `start` so far in e.sample: a resumed turn under way).
  void continue_turn(Episode& e, int64_t start);

  // Resume and replay (episode_resume.cpp). A replayed episode's next turn at response
  // length r: a recorded one sent again (true), or caught up (false: it continues in the
  // engine from the record's open turn).
  bool replay_turn(Episode& e, int64_t r);
  // Response offsets of the recorded observation after the turn just answered (to < 0:
  // the record ended waiting for this reply, and the replay is over).
  struct RecordedSpan {
    int64_t from = -1, to = -1;
  };
  RecordedSpan recorded_observation(Episode& e);
  // The replayed observation is the recorded one (false: the episode diverged and ended).
  bool matches_record(Episode& e, const std::vector<int64_t>& observation, bool new_context,
                      const RecordedSpan& recorded);
  // The step for a model turn of `new_tokens` (stopped: on a stop token or string, not
  // its token limit); *sampled_end: the template's turn end it sampled as its stop token
  // ("" = none).
  EpisodeAction make_action(const Episode& e, const std::vector<int64_t>& new_tokens, bool stopped,
                            std::string* sampled_end) const;
  void send_step(Episode& e, const EpisodeAction& a);
  // The environment has restored a resumed episode (e.restoring): it continues its turn
  // under way, or sends its last turn again when the checkpoint held no reply to it.
  void on_restored(Episode& e);
  // The tokens of a reply's messages (rendered as a conversation with the generation
  // prompt, or one line each without a template), then its token ids: a reset's context,
  // or a new context.
  std::vector<int64_t> context_tokens(const EnvReply& reply) const;
  // Where the latest context's opening tokens end (a response offset): the engine's
  // prompt for that context. Only for a split trajectory (s.context_starts not empty).
  static int64_t context_opened(const Sample& s);
  // Nothing of the latest context (the whole trajectory when it is not split) was sampled:
  // a turn now opens it.
  static bool opens_context(const Sample& s);
  // Whether e's next turn goes to context_prefill_ (set_context_prefill's rule).
  bool prefilled_elsewhere(const Episode& e) const;
  // A turn the engine returned (or holds), in the trajectory's coordinates: the engine
  // runs a split episode's latest context as a sequence of its own (continue_turn).
  Sample whole_trajectory(const Episode& e, Sample&& turn) const;
  // Response tokens an episode with this context may reach (rollout.env_max_total_tokens,
  // model.max_seq_len, the KV cache).
  int64_t response_budget(int64_t prompt_length) const;
  // The engine's work for a turn from response offset `start` up to `limit` response
  // tokens: the trajectory, or its latest context as a sequence of its own.
  WorkItem turn_work(const Episode& e, int64_t start, int64_t limit) const;
  // The observation's tokens after the trajectory (loss mask 0, log-prob 0).
  void append_observation(Episode& e, const std::vector<int64_t>& observation, bool new_context);
  void finish(Episode& e, SampleStatus status, EnvError error, const std::string& why);
  Episode& find(const std::string& id);

  Engine& engine_;
  Environment& env_;
  const Tokenizer& tokenizer_;
  EpisodeSettings settings_;
  const std::vector<Prompt>& prompts_;
  int64_t first_group_;
  std::map<std::string, std::unique_ptr<Episode>> episodes_;  // open (started or waiting to start)
  std::vector<std::string> not_started_;                      // in arrival order
  int64_t open_in_env_ = 0;
  // The chat template's turn ends that are one token each: id -> text (ChatFormat::turn_ends).
  std::vector<std::pair<int64_t, std::string>> turn_end_ids_;
  static constexpr int64_t kFailuresSaid = 4;  // failed episodes warned of one by one; the rest summed up
  int64_t n_failed_ = 0;
  bool said_replay_ = false, said_restart_ = false, said_restore_ = false;  // resumed episodes: said once per runner
  std::optional<Stopwatch> paused_;                  // since pause(), until resume()
  std::vector<Sample> finished_;
  ContextPrefill* context_prefill_ = nullptr;
};

}  // namespace slimpi
