#include "rollout/episode_runner.h"

#include "rollout/episode.h"

#include <slimpi/error.h>

#include <algorithm>
#include <utility>

#include "core/log.h"
#include "core/timer.h"
#include "kernels/counter_rng.h"
#include "rollout/context_threads.h"
#include "tokenizer/chat_transcript.h"

namespace slimpi {


EpisodeRunner::EpisodeRunner(Engine& engine, Environment& env, const Tokenizer& tokenizer,
                             const EpisodeSettings& settings, const std::vector<Prompt>& prompts, int64_t first_group)
    : engine_(engine), env_(env), tokenizer_(tokenizer), settings_(settings), prompts_(prompts),
      first_group_(first_group) {
  if (settings_.chat.enabled())
    for (const std::string& end : settings_.chat.turn_ends())
      if (const std::vector<int64_t> marker = tokenizer_.encode_text(end); marker.size() == 1)
        turn_end_ids_.emplace_back(marker[0], end);
}

EpisodeRunner::~EpisodeRunner() {
  for (auto& [id, e] : episodes_)
    if (e->phase != Episode::Phase::NotStarted) env_.close(id);
  say_unsaid_failures();
}

void EpisodeRunner::say_unsaid_failures() {
  if (n_failed_ > kFailuresSaid)
    log::warn("... and {} more episodes failed in this generation (rollout/env_failed counts them)",
              n_failed_ - kFailuresSaid);
  n_failed_ = 0;
}

void EpisodeRunner::pause() { paused_.emplace(); }

void EpisodeRunner::resume() {
  if (!paused_) return;
  const double s = paused_->seconds();
  paused_.reset();
  env_.exclude_pause(s);
  for (auto& [id, e] : episodes_) {
    e->clock.exclude(s);
    e->wait.exclude(s);
  }
  say_unsaid_failures();
}

bool EpisodeRunner::has_work() const { return !episodes_.empty() || !finished_.empty(); }

EpisodeRunner::Episode& EpisodeRunner::add_episode(const GenerationRequest& request, const Prompt& prompt,
                                                   int64_t index) {
  auto e = std::make_unique<Episode>();
  e->id = episode_id(settings_.stream, request.group_index, index);
  SLIMPI_CHECK(!episodes_.count(e->id), "episodes: {} is already running", e->id);
  e->request = request;
  e->group_prompt = request.prompt;
  // A turn also ends at its tool call's closing marker (</tool_call>).
  auto& stops = e->request.params.stop_strings;
  const std::string call_stop = tool_call_stop(settings_.chat.chat_template);
  if (!call_stop.empty() && std::find(stops.begin(), stops.end(), call_stop) == stops.end()) stops.push_back(call_stop);
  e->prompt = prompt;
  e->sample.group_index = request.group_index;
  e->sample.index = index;
  e->sample.tokens = request.prompt;
  e->sample.prompt_length = int64_t(request.prompt.size());
  not_started_.push_back(e->id);
  Episode& ref = *e;
  episodes_[e->id] = std::move(e);
  return ref;
}

void EpisodeRunner::add_request(const GenerationRequest& request) {
  const int64_t g = request.group_index - first_group_;
  SLIMPI_CHECK(g >= 0 && g < int64_t(prompts_.size()), "episodes: group {} has no prompt record", request.group_index);
  for (int64_t i = 0; i < request.n_samples; ++i) add_episode(request, prompts_[size_t(g)], i);
}

void EpisodeRunner::start_waiting_episodes() {
  size_t started = 0;
  for (; started < not_started_.size() && open_in_env_ < env_.capacity(); ++started) {
    Episode& e = *episodes_.at(not_started_[started]);
    EpisodeStart s;
    s.episode = e.id;
    s.step = int64_t(settings_.stream);
    s.group = e.request.group_index;
    s.sample = e.sample.index;
    s.seed = mix_seed(e.request.seed, uint64_t(e.sample.index), 0x656e7669726f6eULL);
    s.max_turns = settings_.env.max_turns;
    s.max_total_tokens = settings_.env.max_total_tokens;
    s.wall_time_s = settings_.env.episode_wall_s;
    s.prompt = e.prompt.text;
    s.prompt_raw = e.prompt.raw.empty() ? e.prompt.text : e.prompt.raw;
    s.label = e.prompt.label;
    s.metadata_json = e.prompt.metadata;
    e.phase = e.restoring ? Episode::Phase::Restore : Episode::Phase::Reset;
    e.clock = Stopwatch();
    e.wait = Stopwatch();
    ++open_in_env_;
    if (e.restoring) {  // the snapshot follows the turns answered: all but one waiting for its reply
      const WorkItem::EpisodeTurns& t = e.restoring->episode;
      env_.restore(s, int64_t(t.turn_ends.size()) - (t.open_turn < 0 ? 1 : 0), t.env_snapshot);
    } else {
      env_.reset(s);
    }
  }
  not_started_.erase(not_started_.begin(), not_started_.begin() + std::ptrdiff_t(started));
}

EpisodeRunner::Episode& EpisodeRunner::find(const std::string& id) {
  auto it = episodes_.find(id);
  SLIMPI_CHECK(it != episodes_.end(), "episodes: {} is not running", id);
  return *it->second;
}

std::vector<Sample> EpisodeRunner::step() {
  start_waiting_episodes();
  if (engine_.has_work())
    for (Sample& turn : engine_.step()) {
      Episode& e = find(episode_id(settings_.stream, turn.group_index, turn.index));
      on_turn(e, whole_trajectory(e, std::move(turn)));
    }
  // Nothing to decode: wait a little for the environments instead of spinning.
  for (const EnvReply& reply : env_.poll(engine_.has_work() || !finished_.empty() ? 0.0 : 0.005)) {
    auto it = episodes_.find(reply.episode);
    if (it != episodes_.end()) on_reply(*it->second, reply);
  }
  std::vector<Sample> out;
  out.swap(finished_);
  return out;
}

void EpisodeRunner::begin_turn(Episode& e) {
  const int64_t r = e.sample.response_length();
  if (e.replay && replay_turn(e, r)) return;  // a recorded turn sent again (episode_resume.cpp)
  continue_turn(e, r);
}

void EpisodeRunner::continue_turn(Episode& e, int64_t start) {
  // (in the trajectory's response offsets, resumed contexts' copies included)
  const int64_t copied = copied_tokens(e);
  const int64_t limit = std::min(start + settings_.max_turn_tokens, e.budget + copied), r = e.sample.response_length();
  if (r >= limit)  // a resumed turn under way, with this job's smaller limits
    return finish(e, SampleStatus::Truncated, EnvError::Overlong,
                  fmt::format("resumed, its open turn has reached response token {}, at this job's limit of {} "
                              "(rollout.max_new_tokens per turn, the KV cache, model.max_seq_len)", r - copied,
                              limit - copied));
  e.turn_start = start;
  e.phase = Episode::Phase::Turn;
  WorkItem turn = turn_work(e, start, limit);
  if (context_prefill_ && prefilled_elsewhere(e))
    context_prefill_->submit(turn);
  else
    engine_.add_work(turn);
}

void EpisodeRunner::on_reply(Episode& e, const EnvReply& reply) {
  SLIMPI_CHECK(e.phase == Episode::Phase::Reset || e.phase == Episode::Phase::Restore ||
                   e.phase == Episode::Phase::Step || e.phase == Episode::Phase::Ending,
               "episodes: {} got a reply it was not waiting for", e.id);
  e.sample.env_s += float(e.wait.seconds());
  if (e.phase == Episode::Phase::Ending) return on_ending(e, reply);
  if (!accept_reply(e, reply)) return;
  if (e.phase == Episode::Phase::Reset) return on_reset(e, reply);
  on_observation(e, reply);
}

bool EpisodeRunner::accept_reply(Episode& e, const EnvReply& reply) {
  Sample& s = e.sample;
  auto end = [&](SampleStatus status, EnvError error, const std::string& why) {  // the episode ends here
    finish(e, status, error, why);
    return false;
  };
  if (reply.failed) return end(SampleStatus::EnvFailed, EnvError::Infra, reply.message);
  if (reply.error == EnvError::Infra)  // the environment's own failure: as if it had crashed
    return end(SampleStatus::EnvFailed, EnvError::Infra, "the environment reported an infra error: " + reply.message);
  if (e.phase == Episode::Phase::Restore) {
    if (reply.restored) {
      on_restored(e);
      return false;
    }
    return end(SampleStatus::EnvFailed, reply.error == EnvError::None ? EnvError::Infra : reply.error,
               reply.error == EnvError::None
                   ? std::string("its environment answered the restore with an observation, not {\"type\": "
                                 "\"restored\"}")
                   : "its environment could not restore it from its snapshot: " + reply.message);
  }
  if (reply.restored)
    return end(SampleStatus::EnvFailed, EnvError::Infra,
               "its environment answered \"restored\" to a request that was not a restore");
  if (env_.info().snapshots) {
    if (reply.snapshot.empty() && !reply.done && !reply.truncated)
      return end(SampleStatus::EnvFailed, EnvError::Infra,
                 fmt::format("its environment takes snapshots (\"snapshots\": true in its hello), but its "
                             "observation after turn {} has no \"snapshot\"",
                             s.env_turns));
    e.env_snapshot = reply.snapshot;
  }
  if (reply.error != EnvError::None) s.env_error = int8_t(reply.error);
  for (const auto& [name, value] : reply.metrics) s.env_metrics[name] += value;
  return true;
}

void EpisodeRunner::on_reset(Episode& e, const EnvReply& reply) {
  Sample& s = e.sample;
  std::vector<int64_t> context = context_tokens(reply);
  if (context.empty()) context = e.request.prompt;  // the prompt as slimpi renders it
  if (e.replay && context != e.replay->recorded.prompt())
    return diverged(e, fmt::format("its reset now gives a context of {} tokens that differs from the recorded {}",
                                   context.size(), e.replay->recorded.prompt_length));
  if (reply.done || reply.truncated)  // no model turn to train on
    return finish(e, SampleStatus::EnvFailed, reply.error == EnvError::None ? EnvError::Infra : reply.error,
                  "the environment ended the episode at its reset, before the model's first turn" +
                      (reply.message.empty() ? std::string() : ": " + reply.message));
  e.request.prompt = context;
  s.tokens = context;
  s.prompt_length = int64_t(context.size());
  e.budget = response_budget(s.prompt_length);
  if (e.budget < 1 || ((!reply.messages.empty() || !reply.token_ids.empty()) &&
                       int64_t(context.size()) > settings_.env.max_observation_tokens))
    return finish(e, SampleStatus::EnvFailed, EnvError::Overlong,
                  fmt::format("its first observation is {} tokens (rollout.env_max_observation_tokens = {}; "
                              "model.max_seq_len = {}, the KV cache {} tokens)", context.size(),
                              settings_.env.max_observation_tokens, engine_.max_seq_len(),
                              engine_.n_blocks() * engine_.block_size()));
  e.transcript = std::make_unique<ChatTranscript>(settings_.chat);
  begin_turn(e);
}

void EpisodeRunner::on_observation(Episode& e, const EnvReply& reply) {
  const Sample& s = e.sample;
  // A resumed episode: the recorded observation that followed this turn, when there is one.
  const RecordedSpan recorded = e.replay ? recorded_observation(e) : RecordedSpan{};
  e.last_reward = reply.reward;
  e.reward_sum += reply.reward;
  if (e.replay && (reply.done || reply.truncated))
    return diverged(e, fmt::format("its environment ended it at turn {}, where the record continues", s.env_turns));
  if (reply.done || reply.truncated) {
    // A last turn cut at the episode's token budget, not at a stop, is truncated whatever the
    // environment says of it (one cut at rollout.max_new_tokens is the environment's to judge).
    const bool cut_at_budget = !e.turns.turn_stopped.empty() && !e.turns.turn_stopped.back() &&
                               s.response_length() - copied_tokens(e) >= e.budget;
    return finish(e, reply.done && !reply.truncated && !cut_at_budget ? SampleStatus::Completed : SampleStatus::Truncated,
                  reply.error, reply.message);
  }
  if (s.env_turns >= settings_.env.max_turns)
    return stop_at_limit(e, EnvError::None,
                         fmt::format("it reached rollout.env_max_turns = {} model turns", settings_.env.max_turns));
  if (settings_.env.episode_wall_s > 0 && e.clock.seconds() > settings_.env.episode_wall_s)
    return stop_at_limit(e, EnvError::None, fmt::format("it ran past rollout.env_episode_wall_s = {} s",
                                                        settings_.env.episode_wall_s));
  std::vector<int64_t> observation;
  bool new_context = reply.new_context;
  if (!observation_tokens(e, reply, &observation, &new_context)) return;
  // A resumed context's copy of its tokens counts once, where the finished sample keeps it.
  const int64_t copy = e.resuming >= 0 ? context_length(s, e.resuming) : 0;
  const int64_t n = int64_t(observation.size()) - copy, r = s.response_length() - copied_tokens(e);
  if (n > settings_.env.max_observation_tokens)
    return stop_at_limit(e, EnvError::Overlong,
                         fmt::format("an observation of {} tokens (rollout.env_max_observation_tokens = {})", n,
                                     settings_.env.max_observation_tokens));
  if (r + n + 1 > e.budget)
    return stop_at_limit(e, EnvError::Overlong,
                         fmt::format("the episode would reach {} response tokens with its next observation (budget {}: "
                                     "rollout.env_max_total_tokens, model.max_seq_len, the KV cache)", r + n + 1,
                                     e.budget));
  if (e.replay && !matches_record(e, observation, new_context, recorded)) return;
  append_observation(e, observation, new_context);
  begin_turn(e);
}

void EpisodeRunner::stop_at_limit(Episode& e, EnvError error, const std::string& why) {
  if (!env_.rewards_at_end() || e.replay) return finish(e, SampleStatus::Truncated, error, why);
  e.phase = Episode::Phase::Ending;
  e.end_error = error;
  e.end_why = why;
  e.wait = Stopwatch();
  env_.end(e.id, error, why);
}

void EpisodeRunner::on_ending(Episode& e, const EnvReply& reply) {
  if (reply.failed)
    return finish(e, SampleStatus::EnvFailed, EnvError::Infra,
                  fmt::format("stopped at its limit ({}), then: {}", e.end_why, reply.message));
  e.last_reward = reply.reward;
  e.reward_sum += reply.reward;
  for (const auto& [name, value] : reply.metrics) e.sample.env_metrics[name] += value;
  finish(e, SampleStatus::Truncated, e.end_error, e.end_why);
}

bool EpisodeRunner::observation_tokens(Episode& e, const EnvReply& reply, std::vector<int64_t>* out,
                                       bool* new_context) {
  *new_context = reply.new_context;
  if (reply.new_context && reply.resume_context >= 0) return resumed_context_tokens(e, reply, out);
  if (reply.new_context) {  // the model sees this alone from here on: rendered as a conversation of its own
    *out = context_tokens(reply);
    if (!out->empty()) return true;
    finish(e, SampleStatus::EnvFailed, EnvError::Infra,
           fmt::format("its environment opened a new context after turn {} with nothing in it", e.sample.env_turns));
    return false;
  }
  std::string why;
  const std::string delta = e.transcript->add_observation(reply.messages, &why);
  if (!why.empty() && !reply.conversation.empty()) {  // the whole conversation, as a context of its own
    // (the transcript, which took the messages before it refused, is replaced by append_observation)
    *out = whole_conversation(e, reply, why);
    *new_context = true;
    e.rewrote = true;
    return true;
  }
  if (!why.empty()) SLIMPI_FAIL("episode {}: {}", e.id, why);
  if (!delta.empty()) *out = tokenizer_.encode_text(delta);
  out->insert(out->end(), reply.token_ids.begin(), reply.token_ids.end());
  return true;
}

std::vector<int64_t> EpisodeRunner::whole_conversation(const Episode& e, const EnvReply& reply,
                                                      const std::string& why) const {
  static bool said = false;
  if (!std::exchange(said, true))
    log::warn("episode {}: {}; its conversation opens a new context instead (the whole conversation rendered "
              "again: every such turn does). Said once", e.id, why);
  EnvReply whole;
  whole.messages = reply.conversation;
  return context_tokens(whole);
}

bool EpisodeRunner::resumed_context_tokens(Episode& e, const EnvReply& reply, std::vector<int64_t>* out) {
  const int64_t k = reply.resume_context, latest = int64_t(e.sample.context_starts.size());
  const auto by = std::find(e.continued_from.begin(), e.continued_from.end(), k);
  const bool held = k < latest && k < int64_t(e.left_transcripts.size()) && !e.left_transcripts[size_t(k)].empty();
  if (!held) {
    const int64_t turn = e.sample.env_turns;
    finish(e, SampleStatus::EnvFailed, EnvError::Infra,
           k >= latest ? fmt::format("its environment resumed context {} after turn {}, but the episode has left {} "
                                     "(context {}, the latest, continues without a new context)", k, turn,
                                     latest == 0 ? std::string("no context") : fmt::format("contexts 0 to {} only", latest - 1),
                                     latest)
           : by != e.continued_from.end()
               ? fmt::format("its environment resumed context {} after turn {}, which context {} continues already "
                             "(a thread goes on from its latest context)", k, turn, by - e.continued_from.begin())
               : fmt::format("its environment resumed context {} after turn {}, whose chat transcript was not kept "
                             "(the template rewrote that context's history when it was left, or the episode was "
                             "restored from a checkpoint that does not hold it)", k, turn));
    return false;
  }
  std::unique_ptr<ChatTranscript> transcript;
  try {
    transcript = std::make_unique<ChatTranscript>(ChatTranscript::load(settings_.chat, e.left_transcripts[size_t(k)]));
  } catch (const Error& err) {
    finish(e, SampleStatus::EnvFailed, EnvError::Infra,
           fmt::format("its environment resumed context {}, whose kept chat transcript does not load: {}", k, err.what()));
    return false;
  }
  std::string why;
  const std::string delta = transcript->add_observation(reply.messages, &why);
  if (!why.empty() && !reply.conversation.empty()) {  // as an edited history: a context of its own
    // (only the left context's transcript, loaded here, took the refused messages: the
    // latest context's stays good to resume, and no flag is set)
    *out = whole_conversation(e, reply, why);
    return true;
  }
  if (!why.empty()) {
    finish(e, SampleStatus::EnvFailed, EnvError::Infra,
           fmt::format("its environment resumed context {} after turn {} with messages the chat template does not "
                       "continue that context with: {}", k, e.sample.env_turns, why));
    return false;
  }
  *out = context_of(e.sample, k);
  if (!delta.empty()) {
    const std::vector<int64_t> ids = tokenizer_.encode_text(delta);
    out->insert(out->end(), ids.begin(), ids.end());
  }
  out->insert(out->end(), reply.token_ids.begin(), reply.token_ids.end());
  e.resuming = k;
  e.resumed_transcript = std::move(transcript);
  return true;
}

void EpisodeRunner::on_turn(Episode& e, Sample&& turn) {
  SLIMPI_CHECK(e.phase == Episode::Phase::Turn, "episodes: {} returned a turn it was not taking", e.id);
  Sample& s = e.sample;
  const int64_t r0 = e.turn_start, r = turn.response_length();
  const std::vector<int64_t> new_tokens(turn.tokens.begin() + turn.prompt_length + r0, turn.tokens.end());
  s.tokens = std::move(turn.tokens);
  s.rollout_log_probs = std::move(turn.rollout_log_probs);
  s.weight_versions = std::move(turn.weight_versions);
  s.sampling_support = turn.sampling_support.empty() ? std::vector<int32_t>(size_t(r), 0) : std::move(turn.sampling_support);
  s.routing = std::move(turn.routing);
  s.spec_drafted = turn.spec_drafted;
  s.spec_accepted = turn.spec_accepted;
  s.spec_passes = turn.spec_passes;
  s.loss_mask.resize(size_t(r), 1.0f);
  ++s.env_turns;
  e.turns.turn_starts.push_back(r0);
  e.turns.turn_ends.push_back(r);
  e.turns.turn_stopped.push_back(turn.status == SampleStatus::Completed);

  std::string sampled_end;
  EpisodeAction a = make_action(e, new_tokens, turn.status == SampleStatus::Completed, &sampled_end);
  s.env_tool_calls += int32_t(a.tool_calls.size());
  e.transcript->add_model_turn(a.text, sampled_end);
  send_step(e, a);
}

EpisodeAction EpisodeRunner::make_action(const Episode& e, const std::vector<int64_t>& new_tokens, bool stopped,
                                         std::string* sampled_end) const {
  const auto& stops = e.request.params.stop_token_ids;
  const bool on_stop_token = stopped && !new_tokens.empty() &&
                             std::find(stops.begin(), stops.end(), new_tokens.back()) != stops.end();
  sampled_end->clear();
  for (const auto& [id, text] : turn_end_ids_)
    if (on_stop_token && new_tokens.back() == id) *sampled_end = text;
  EpisodeAction a;
  a.episode = e.id;
  a.turn = e.sample.env_turns;
  a.text = tokenizer_.decode(on_stop_token ? std::vector<int64_t>(new_tokens.begin(), new_tokens.end() - 1) : new_tokens);
  a.token_ids = new_tokens;
  const size_t n_text = new_tokens.size() - (on_stop_token ? 1 : 0);
  const auto& log_probs = e.sample.rollout_log_probs;  // (the response's; this turn's from its start, e.turn_start)
  const size_t first = size_t(e.turn_start);
  SLIMPI_CHECK(first + new_tokens.size() <= log_probs.size(), "episodes: {}: a turn of {} tokens at response token {} "
               "of {} log-probs", e.id, new_tokens.size(), first, log_probs.size());
  for (size_t k = 0; env_.info().token_details && k < n_text; ++k) {
    a.token_texts.push_back(tokenizer_.decode({new_tokens[k]}));
    a.log_probs.push_back(log_probs[first + k]);
  }
  a.tool_calls = parse_tool_calls(a.text, settings_.chat.chat_template);
  a.finish_reason = stopped ? "stop" : "length";
  const auto& contexts = e.sample.context_starts;  // (response offsets where a new context began)
  a.context_tokens = contexts.empty() ? e.sample.prompt_length + e.turn_start : e.turn_start - contexts.back();
  a.context = int64_t(contexts.size());
  return a;
}

void EpisodeRunner::send_step(Episode& e, const EpisodeAction& a) {
  e.phase = Episode::Phase::Step;
  e.wait = Stopwatch();
  env_.step(a);
}

void EpisodeRunner::finish(Episode& e, SampleStatus status, EnvError error, const std::string& why) {
  Sample& s = e.sample;
  if (status == SampleStatus::EnvFailed && error == EnvError::Infra && settings_.env.fail_job)
    SLIMPI_FAIL("episode {} (group {}, sample {}): {} (rollout.env_fail_job = true ends the job)", e.id,
                s.group_index, s.index, why);
  s.status = status;
  if (error != EnvError::None) s.env_error = int8_t(error);
  s.raw_reward = float(settings_.env.reward == "sum" ? e.reward_sum : e.last_reward);
  // A failed episode keeps the loss mask of what the model sampled (rollouts.h5 and
  // transcript.py show whose tokens they were); it is never trained: its group is
  // recorded with the filtered ones, and only completed or truncated samples train.
  if (status == SampleStatus::EnvFailed) s.raw_reward = 0;
  s.episode_s += float(e.clock.seconds());  // (a restored episode's time before its checkpoint included)
  if (std::all_of(s.sampling_support.begin(), s.sampling_support.end(), [](int32_t k) { return k == 0; }))
    s.sampling_support.clear();
  static bool said_overlong = false;  // an over-long episode is a truncation, not a failure: said once
  if (status == SampleStatus::EnvFailed) {
    if (++n_failed_ <= kFailuresSaid)  // the rest summed up by the destructor
      log::warn("episode {} (group {}, sample {}) failed after {} turns (its group is not trained): {}", e.id,
                s.group_index, s.index, s.env_turns, why);
  } else if (error == EnvError::Overlong && !std::exchange(said_overlong, true)) {
    log::warn("episode {} (group {}, sample {}) truncated after {} turns: {}. Said once: rollout/env_error/overlong "
              "counts them", e.id, s.group_index, s.index, s.env_turns, why);
  }
  join_resumed_contexts(s, e.continued_from);  // each thread once
  const std::string id = e.id;
  env_.ended(id, error, why);
  env_.close(id);
  --open_in_env_;
  finished_.push_back(std::move(s));
  episodes_.erase(id);  // e is gone
}

}  // namespace slimpi
