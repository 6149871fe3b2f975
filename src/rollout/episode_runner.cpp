#include "rollout/episode_runner.h"

#include <slimpi/error.h>

#include <algorithm>
#include <utility>

#include "core/log.h"
#include "core/timer.h"
#include "kernels/counter_rng.h"
#include "tokenizer/chat_transcript.h"

namespace slimpi {

struct EpisodeRunner::Episode {
  std::string id;
  GenerationRequest request;          // the group's; prompt = the episode's context once reset
  std::vector<int64_t> group_prompt;  // the group's prompt tokens (request.prompt before the reset)
  Prompt prompt;
  Sample sample;  // the trajectory so far; every per-response-token field complete
  WorkItem::EpisodeTurns turns;  // the model turns sent to the environment so far (open_turn unused)
  std::unique_ptr<ChatTranscript> transcript;
  enum class Phase { NotStarted, Reset, Restore, Turn, Step } phase = Phase::NotStarted;
  int64_t turn_start = 0;  // response length where the current model turn began
  int64_t budget = 0;      // response tokens the episode may reach
  double reward_sum = 0, last_reward = 0;
  Stopwatch clock;  // since the reset was sent
  Stopwatch wait;   // since the outstanding request was sent
  // A resumed episode: the checkpointed trajectory and turns it is brought back to; `next`
  // is the recorded turn to send next. Gone once the episode has caught up.
  struct Replay {
    Sample recorded;
    WorkItem::EpisodeTurns turns;
    size_t next = 0;
  };
  std::optional<Replay> replay;
  std::string env_snapshot;  // the environment's state after the last reply (info().snapshots)
  // A resumed episode restored from its snapshot: the checkpointed item, until restored.
  std::optional<WorkItem> restoring;
};

namespace {

std::string episode_id(uint64_t stream, int64_t group, int64_t index) {
  return fmt::format("{}/{}/{}", stream, group, index);
}

// The recorded trajectory up to response offset `end` (a turn's end), as the engine
// returned that turn: tokens and the per-token fields of the rollout.
Sample recorded_turn(const Sample& rec, int64_t end) {
  Sample t;
  t.group_index = rec.group_index;
  t.index = rec.index;
  t.prompt_length = rec.prompt_length;
  t.tokens.assign(rec.tokens.begin(), rec.tokens.begin() + rec.prompt_length + end);
  t.rollout_log_probs.assign(rec.rollout_log_probs.begin(), rec.rollout_log_probs.begin() + end);
  t.weight_versions.assign(rec.weight_versions.begin(), rec.weight_versions.begin() + end);
  if (!rec.sampling_support.empty())
    t.sampling_support.assign(rec.sampling_support.begin(), rec.sampling_support.begin() + end);
  // The routing trace covers the recorded tokens (its last engine turn's): kept for the
  // record's last turn, empty before it (an engine turn after the replay recomputes it).
  if (end == rec.response_length()) t.routing = rec.routing;
  t.spec_drafted = rec.spec_drafted;
  t.spec_accepted = rec.spec_accepted;
  t.spec_passes = rec.spec_passes;
  return t;
}

// The whole recorded trajectory into `s`: tokens (the open turn's after `s`'s own, which
// equal the record's: checked by the caller) and every per-response-token vector.
void adopt_recorded(Sample& s, const Sample& rec) {
  s.tokens = rec.tokens;
  s.rollout_log_probs = rec.rollout_log_probs;
  s.weight_versions = rec.weight_versions;
  const size_t r = size_t(rec.response_length());
  s.sampling_support = rec.sampling_support.empty() ? std::vector<int32_t>(r, 0) : rec.sampling_support;
  s.loss_mask = rec.loss_mask.empty() ? std::vector<float>(r, 1.0f) : rec.loss_mask;
  s.routing = rec.routing;
  s.context_starts = rec.context_starts;
}

// A checkpointed episode must hold together: turns in order within the response, every
// per-token vector R long, and either a turn under way or the last turn waiting for its reply.
void check_record(const std::string& id, const Sample& part, const WorkItem::EpisodeTurns& t) {
  const int64_t n = int64_t(t.turn_ends.size()), r = part.response_length();
  bool ok = int64_t(t.turn_starts.size()) == n && int64_t(t.turn_stopped.size()) == n &&
            int64_t(part.rollout_log_probs.size()) == r && int64_t(part.weight_versions.size()) == r &&
            (part.loss_mask.empty() || int64_t(part.loss_mask.size()) == r) &&
            (part.sampling_support.empty() || int64_t(part.sampling_support.size()) == r);
  for (int64_t k = 0, at = 0; ok && k < n; at = t.turn_ends[size_t(k)], ++k)
    ok = at <= t.turn_starts[size_t(k)] && t.turn_starts[size_t(k)] < t.turn_ends[size_t(k)] &&
         t.turn_ends[size_t(k)] <= r;
  ok = ok && t.open_turn <= r && (t.open_turn < 0 || n == 0 || t.open_turn >= t.turn_ends.back()) &&
       (t.open_turn >= 0 || (n > 0 && t.turn_ends.back() == r));
  // Later contexts: increasing within the response, each opened by environment tokens.
  for (size_t c = 0; ok && c < part.context_starts.size(); ++c) {
    const int64_t at = part.context_starts[c];
    ok = at > (c == 0 ? 0 : part.context_starts[c - 1]) && at < r && !part.loss_mask.empty() &&
         part.loss_mask[size_t(at)] == 0.0f;
  }
  SLIMPI_CHECK(ok, "episodes: {} resumed with a record that does not hold together ({} turns, {} response tokens, "
               "open turn at {}): the checkpoint's async_work.h5 and async_state.json disagree", id, n, r, t.open_turn);
}

}  // namespace

EpisodeRunner::EpisodeRunner(Engine& engine, Environment& env, const Tokenizer& tokenizer,
                             const EpisodeSettings& settings, const std::vector<Prompt>& prompts, int64_t first_group)
    : engine_(engine), env_(env), tokenizer_(tokenizer), settings_(settings), prompts_(prompts),
      first_group_(first_group) {
  if (settings_.chat.enabled()) {
    const std::vector<int64_t> marker = tokenizer_.encode_text(settings_.chat.end_of_turn());
    if (marker.size() == 1) end_of_turn_id_ = marker[0];
  }
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

void EpisodeRunner::add_work(const WorkItem& item) {
  SLIMPI_CHECK(item.record, "episodes: group {} came without its prompt record", item.request.group_index);
  if (item.is_group()) {
    for (int64_t i = 0; i < item.request.n_samples; ++i) add_episode(item.request, *item.record, i);
    return;
  }
  const Sample& part = item.partial;
  Episode& e = add_episode(item.request, *item.record, part.index);
  if (part.response_length() == 0 && item.episode.empty()) return;  // not past its reset: it starts as new
  if (env_.info().snapshots && !item.episode.env_snapshot.empty()) {
    check_record(e.id, part, item.episode);
    e.restoring = item;
    if (!std::exchange(said_restore_, true))
      log::all("resuming episodes in flight: each is restored from its environment's snapshot (environment {} takes "
               "snapshots), then continues", env_.info().name);
  } else if (env_.info().deterministic) {
    check_record(e.id, part, item.episode);
    e.replay = Episode::Replay{part, item.episode, 0};
    if (!std::exchange(said_replay_, true))
      log::all("resuming episodes in flight: each is reset again and sent its recorded turns (environment {} "
                "declares itself deterministic), then continues", env_.info().name);
  } else if (!std::exchange(said_restart_, true)) {
    log::warn("resuming episodes in flight: environment {} does not declare itself deterministic, so they cannot be "
              "replayed; they start again from their reset (their partial trajectories are dropped)",
              env_.info().name);
  }
}

std::vector<WorkItem> EpisodeRunner::snapshot(const std::vector<WorkItem>& turns) const {
  std::map<std::pair<int64_t, int64_t>, const WorkItem*> in_engine;  // (group, sample) -> its turn
  for (const WorkItem& t : turns) {
    SLIMPI_CHECK(!t.is_group(), "episodes: the engine holds a group, not an episode's turn");
    in_engine[{t.partial.group_index, t.partial.index}] = &t;
  }
  std::vector<WorkItem> out;
  for (const auto& [id, ep] : episodes_) {
    const Episode& e = *ep;
    if (e.restoring) {  // not restored yet: the checkpointed state still stands
      out.push_back(*e.restoring);
      continue;
    }
    WorkItem w;
    w.request = e.request;
    w.request.prompt = e.group_prompt;
    w.record = e.prompt;
    if (e.replay) {  // not caught up: the checkpointed state still stands
      w.partial = e.replay->recorded;
      w.episode = e.replay->turns;
    } else if (e.phase == Episode::Phase::NotStarted || e.phase == Episode::Phase::Reset) {
      w.partial.group_index = e.sample.group_index;
      w.partial.index = e.sample.index;
      w.partial.tokens = e.group_prompt;
      w.partial.prompt_length = int64_t(e.group_prompt.size());
    } else {
      w.partial = e.sample;
      w.episode = e.turns;
      if (e.phase == Episode::Phase::Turn) {
        const auto t = in_engine.find({e.sample.group_index, e.sample.index});
        SLIMPI_CHECK(t != in_engine.end(), "episodes: {} is taking a turn the engine does not hold", e.id);
        const Sample p = whole_trajectory(e, Sample(t->second->partial));
        w.partial.tokens = p.tokens;
        w.partial.rollout_log_probs = p.rollout_log_probs;
        w.partial.weight_versions = p.weight_versions;
        w.partial.sampling_support = p.sampling_support.empty()
                                         ? std::vector<int32_t>(size_t(p.response_length()), 0)
                                         : p.sampling_support;
        w.partial.loss_mask.resize(size_t(p.response_length()), 1.0f);
        w.partial.spec_drafted = p.spec_drafted;
        w.partial.spec_accepted = p.spec_accepted;
        w.partial.spec_passes = p.spec_passes;
        w.episode.open_turn = e.turn_start;
      }
      if (!e.env_snapshot.empty()) {  // restorable without a replay
        w.partial.episode_s = float(e.sample.episode_s + e.clock.seconds());  // its clock so far, as env_s
        w.episode.env_snapshot = e.env_snapshot;
        w.episode.transcript = e.transcript->save();
        w.episode.reward_sum = e.reward_sum;
        w.episode.last_reward = e.last_reward;
      }
    }
    out.push_back(std::move(w));
  }
  return out;
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
  if (e.replay) {
    Episode::Replay& rp = *e.replay;
    if (rp.next < rp.turns.turn_ends.size()) {  // a turn it took before: sent again as it was
      const int64_t start = rp.turns.turn_starts[rp.next], end = rp.turns.turn_ends[rp.next];
      if (start != r || end <= start)
        return diverged(e, fmt::format("its turn {} began at response token {}, and would now begin at {}",
                                       rp.next + 1, start, r));
      if (end > e.budget)  // this job's limits (the KV cache, max_seq_len) are smaller than the recording job's
        return finish(e, SampleStatus::Truncated, EnvError::Overlong,
                      fmt::format("resumed, its turn {} ends at response token {}, past this job's budget of {}",
                                  rp.next + 1, end, e.budget));
      Sample turn = recorded_turn(rp.recorded, end);
      turn.status = rp.turns.turn_stopped[rp.next] ? SampleStatus::Completed : SampleStatus::Truncated;
      ++rp.next;
      e.turn_start = r;
      e.phase = Episode::Phase::Turn;
      return on_turn(e, std::move(turn));
    }
    // Caught up with the record: a turn under way continues in the engine from its tokens.
    const int64_t open = rp.turns.open_turn;
    SLIMPI_CHECK(open == r, "episodes: {} resumed with an open turn at response token {}, reached {}", e.id, open, r);
    adopt_recorded(e.sample, rp.recorded);  // the open turn's tokens so far, after r
    e.replay.reset();
  }
  continue_turn(e, r);
}

void EpisodeRunner::continue_turn(Episode& e, int64_t start) {
  const int64_t limit = std::min(start + settings_.max_turn_tokens, e.budget), r = e.sample.response_length();
  if (r >= limit)  // a resumed turn under way, with this job's smaller limits
    return finish(e, SampleStatus::Truncated, EnvError::Overlong,
                  fmt::format("resumed, its open turn has reached response token {}, at this job's limit of {} "
                              "(rollout.max_new_tokens per turn, the KV cache, model.max_seq_len)", r, limit));
  WorkItem w;
  w.request = e.request;
  w.partial = e.sample;
  w.request.params.max_new_tokens = limit;
  w.request.stop_strings_from = start;
  const std::vector<int64_t>& contexts = e.sample.context_starts;
  if (!contexts.empty()) {
    // A later context: the engine runs it as a sequence of its own, the context's opening
    // tokens its prompt and what followed them its response (as the first context's
    // prompt and response), sampling under the context's own seed.
    const Sample& s = e.sample;
    const int64_t opened = context_opened(s);
    Sample& v = w.partial;
    v.tokens.assign(s.tokens.begin() + s.prompt_length + contexts.back(), s.tokens.end());
    v.prompt_length = opened - contexts.back();
    v.rollout_log_probs.assign(s.rollout_log_probs.begin() + opened, s.rollout_log_probs.end());
    v.weight_versions.assign(s.weight_versions.begin() + opened, s.weight_versions.end());
    v.sampling_support = s.sampling_support.empty() ? std::vector<int32_t>()
                                                    : std::vector<int32_t>(s.sampling_support.begin() + opened,
                                                                           s.sampling_support.end());
    v.loss_mask.clear();
    v.routing.clear();
    v.context_starts.clear();
    w.request.prompt = v.prompt();
    w.request.seed = mix_seed(e.request.seed, uint64_t(contexts.size()), 0x636f6e74657874ULL);
    w.request.params.max_new_tokens = limit - opened;
    w.request.stop_strings_from = start - opened;
  }
  e.turn_start = start;
  e.phase = Episode::Phase::Turn;
  engine_.add_work(w);
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

  bool on_end_of_turn = false;
  EpisodeAction a = make_action(e, new_tokens, turn.status == SampleStatus::Completed, &on_end_of_turn);
  s.env_tool_calls += int32_t(a.tool_calls.size());
  e.transcript->add_model_turn(a.text, on_end_of_turn);
  send_step(e, a);
}

EpisodeAction EpisodeRunner::make_action(const Episode& e, const std::vector<int64_t>& new_tokens, bool stopped,
                                         bool* on_end_of_turn) const {
  const auto& stops = e.request.params.stop_token_ids;
  const bool on_stop_token = stopped && !new_tokens.empty() &&
                             std::find(stops.begin(), stops.end(), new_tokens.back()) != stops.end();
  *on_end_of_turn = on_stop_token && new_tokens.back() == end_of_turn_id_;
  EpisodeAction a;
  a.episode = e.id;
  a.turn = e.sample.env_turns;
  a.text = tokenizer_.decode(on_stop_token ? std::vector<int64_t>(new_tokens.begin(), new_tokens.end() - 1) : new_tokens);
  a.token_ids = new_tokens;
  a.tool_calls = parse_tool_calls(a.text, settings_.chat.chat_template);
  a.finish_reason = stopped ? "stop" : "length";
  return a;
}

void EpisodeRunner::send_step(Episode& e, const EpisodeAction& a) {
  e.phase = Episode::Phase::Step;
  e.wait = Stopwatch();
  env_.step(a);
}

void EpisodeRunner::on_reply(Episode& e, const EnvReply& reply) {
  SLIMPI_CHECK(e.phase == Episode::Phase::Reset || e.phase == Episode::Phase::Restore ||
                   e.phase == Episode::Phase::Step,
               "episodes: {} got a reply it was not waiting for", e.id);
  Sample& s = e.sample;
  s.env_s += float(e.wait.seconds());
  if (reply.failed) return finish(e, SampleStatus::EnvFailed, EnvError::Infra, reply.message);
  if (reply.error == EnvError::Infra)  // the environment's own failure: as if it had crashed
    return finish(e, SampleStatus::EnvFailed, EnvError::Infra, "the environment reported an infra error: " + reply.message);
  if (e.phase == Episode::Phase::Restore) {
    if (reply.restored) return on_restored(e);
    return finish(e, SampleStatus::EnvFailed, reply.error == EnvError::None ? EnvError::Infra : reply.error,
                  reply.error == EnvError::None
                      ? std::string("its environment answered the restore with an observation, not {\"type\": "
                                    "\"restored\"}")
                      : "its environment could not restore it from its snapshot: " + reply.message);
  }
  if (reply.restored)
    return finish(e, SampleStatus::EnvFailed, EnvError::Infra,
                  "its environment answered \"restored\" to a request that was not a restore");
  if (env_.info().snapshots) {
    if (reply.snapshot.empty() && !reply.done && !reply.truncated)
      return finish(e, SampleStatus::EnvFailed, EnvError::Infra,
                    fmt::format("its environment takes snapshots (\"snapshots\": true in its hello), but its "
                                "observation after turn {} has no \"snapshot\"", s.env_turns));
    e.env_snapshot = reply.snapshot;
  }
  if (reply.error != EnvError::None) s.env_error = int8_t(reply.error);
  for (const auto& [name, value] : reply.metrics) s.env_metrics[name] += value;

  if (e.phase == Episode::Phase::Reset) {
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
    return begin_turn(e);
  }

  // A resumed episode: the recorded observation that followed this turn, when there is one.
  int64_t recorded_from = -1, recorded_to = -1;  // response offsets
  if (e.replay) {
    const Episode::Replay& rp = *e.replay;
    recorded_from = rp.turns.turn_ends[rp.next - 1];
    recorded_to = rp.next < rp.turns.turn_ends.size() ? rp.turns.turn_starts[rp.next] : rp.turns.open_turn;
    if (recorded_to < 0) e.replay.reset();  // the record ended waiting for this reply: caught up
  }
  e.last_reward = reply.reward;
  e.reward_sum += reply.reward;
  if (e.replay && (reply.done || reply.truncated))
    return diverged(e, fmt::format("its environment ended it at turn {}, where the record continues", s.env_turns));
  if (reply.done || reply.truncated)
    return finish(e, reply.done && !reply.truncated ? SampleStatus::Completed : SampleStatus::Truncated, reply.error,
                  reply.message);
  if (s.env_turns >= settings_.env.max_turns) return finish(e, SampleStatus::Truncated, EnvError::None, "");
  if (settings_.env.episode_wall_s > 0 && e.clock.seconds() > settings_.env.episode_wall_s)
    return finish(e, SampleStatus::Truncated, EnvError::None, "");
  std::vector<int64_t> observation;
  if (reply.new_context) {  // the model sees this alone from here on: rendered as a conversation of its own
    observation = context_tokens(reply);
    if (observation.empty())
      return finish(e, SampleStatus::EnvFailed, EnvError::Infra,
                    fmt::format("its environment opened a new context after turn {} with nothing in it", s.env_turns));
  } else {
    std::string why;
    const std::string delta = e.transcript->add_observation(reply.messages, &why);
    if (!why.empty()) SLIMPI_FAIL("episode {}: {}", e.id, why);
    if (!delta.empty()) observation = tokenizer_.encode_text(delta);
    observation.insert(observation.end(), reply.token_ids.begin(), reply.token_ids.end());
  }
  const int64_t n = int64_t(observation.size()), r = s.response_length();
  if (n > settings_.env.max_observation_tokens)
    return finish(e, SampleStatus::Truncated, EnvError::Overlong,
                  fmt::format("an observation of {} tokens (rollout.env_max_observation_tokens = {})", n,
                              settings_.env.max_observation_tokens));
  if (r + n + 1 > e.budget)
    return finish(e, SampleStatus::Truncated, EnvError::Overlong,
                  fmt::format("the episode would reach {} response tokens with its next observation (budget {}: "
                              "rollout.env_max_total_tokens, model.max_seq_len, the KV cache)", r + n + 1, e.budget));
  if (e.replay) {
    const Sample& rec = e.replay->recorded;
    const auto at = rec.tokens.begin() + rec.prompt_length;
    if (recorded_from != r || recorded_to - recorded_from != n ||
        !std::equal(observation.begin(), observation.end(), at + recorded_from))
      return diverged(e, fmt::format("its observation after turn {} is {} tokens that differ from the recorded {}",
                                     s.env_turns, n, recorded_to - recorded_from));
    const bool recorded_new = std::find(rec.context_starts.begin(), rec.context_starts.end(), r) != rec.context_starts.end();
    if (reply.new_context != recorded_new)
      return diverged(e, fmt::format("its observation after turn {} {} a new context, where the recorded one {}",
                                     s.env_turns, reply.new_context ? "opens" : "does not open",
                                     recorded_new ? "did" : "did not"));
  }
  s.tokens.insert(s.tokens.end(), observation.begin(), observation.end());
  s.rollout_log_probs.resize(size_t(r + n), 0.0f);
  s.sampling_support.resize(size_t(r + n), 0);
  s.weight_versions.resize(size_t(r + n), engine_.weight_version());
  if (e.replay)  // the weights it was appended under
    std::copy(e.replay->recorded.weight_versions.begin() + r, e.replay->recorded.weight_versions.begin() + r + n,
              s.weight_versions.begin() + r);
  s.loss_mask.resize(size_t(r + n), 0.0f);
  if (reply.new_context) {
    s.context_starts.push_back(r);
    s.routing.clear();  // a split trajectory carries no routing trace (train/packed_batch.h)
    e.transcript = std::make_unique<ChatTranscript>(settings_.chat);
  }
  begin_turn(e);
}

int64_t EpisodeRunner::context_opened(const Sample& s) {
  // The context's opening tokens are the environment's (loss mask 0) up to its first model
  // token; until the model takes its first turn there, all of the trajectory after it.
  int64_t t = s.context_starts.back();
  while (t < int64_t(s.loss_mask.size()) && s.loss_mask[size_t(t)] == 0.0f) ++t;
  return t;
}

std::vector<int64_t> EpisodeRunner::context_tokens(const EnvReply& reply) const {
  std::vector<int64_t> context;
  if (!reply.messages.empty()) {
    std::string text;
    if (settings_.chat.enabled()) {
      text = render_chat(reply.messages, settings_.chat, /*add_generation_prompt=*/true);
      context = tokenizer_.encode_chat(text);
    } else {
      for (const ChatMessage& m : reply.messages) text += m.content + "\n";
      context = tokenizer_.encode_prompt(text);
    }
  }
  context.insert(context.end(), reply.token_ids.begin(), reply.token_ids.end());
  return context;
}

Sample EpisodeRunner::whole_trajectory(const Episode& e, Sample&& turn) const {
  const Sample& s = e.sample;
  if (s.context_starts.empty()) return std::move(turn);
  // turn: the engine's sequence of the latest context, its prompt the context's opening
  // tokens (up to response offset `start` in the trajectory), its response what followed.
  const int64_t start = s.context_starts.back() + turn.prompt_length;
  SLIMPI_CHECK(start == context_opened(s) && start + turn.response_length() >= e.turn_start,
               "episodes: {}: the engine returned a context opened at response token {} (the trajectory's at {}) of "
               "{} response tokens, its turn begun at {}", e.id, start, context_opened(s), turn.response_length(),
               e.turn_start);
  Sample out = std::move(turn);
  std::vector<int64_t> tokens(s.tokens.begin(), s.tokens.begin() + s.prompt_length + s.context_starts.back());
  tokens.insert(tokens.end(), out.tokens.begin(), out.tokens.end());
  out.tokens = std::move(tokens);
  out.prompt_length = s.prompt_length;
  auto before = [&](const auto& field, auto& view) {  // the trajectory's entries before the turn, then the view's
    using V = typename std::decay_t<decltype(view)>::value_type;
    std::vector<V> whole(field.begin(), field.begin() + start);
    whole.insert(whole.end(), view.begin(), view.end());
    view = std::move(whole);
  };
  before(s.rollout_log_probs, out.rollout_log_probs);
  before(s.weight_versions, out.weight_versions);
  if (!out.sampling_support.empty() || !s.sampling_support.empty()) {
    if (out.sampling_support.empty()) out.sampling_support.assign(size_t(out.response_length() - start), 0);
    const std::vector<int32_t> earlier =
        s.sampling_support.empty() ? std::vector<int32_t>(size_t(start), 0) : s.sampling_support;
    before(earlier, out.sampling_support);
  }
  out.routing.clear();  // a split trajectory carries no routing trace (train/packed_batch.h)
  out.context_starts = s.context_starts;
  return out;
}

int64_t EpisodeRunner::response_budget(int64_t prompt_length) const {
  const int64_t cache_tokens = engine_.n_blocks() * engine_.block_size();
  return std::min({settings_.env.max_total_tokens, engine_.max_seq_len() - prompt_length, cache_tokens - prompt_length});
}

void EpisodeRunner::on_restored(Episode& e) {
  const WorkItem item = std::move(*e.restoring);
  e.restoring.reset();
  const WorkItem::EpisodeTurns& t = item.episode;
  Sample& s = e.sample;
  const Sample& rec = item.partial;
  e.request.prompt = rec.prompt();
  s.prompt_length = rec.prompt_length;
  adopt_recorded(s, rec);  // tokens, per-token fields, context starts
  s.env_turns = rec.env_turns;
  s.env_tool_calls = rec.env_tool_calls;
  // One clock rule for a restored episode: env_s and episode_s both hold its time before
  // the checkpoint plus its time since the restore (so env_s <= episode_s holds).
  s.env_s += rec.env_s;
  s.episode_s = rec.episode_s;
  s.env_error = rec.env_error;
  s.env_metrics = rec.env_metrics;
  s.spec_drafted = rec.spec_drafted;
  s.spec_accepted = rec.spec_accepted;
  s.spec_passes = rec.spec_passes;
  e.turns = t;
  e.turns.open_turn = -1;
  try {
    e.transcript = std::make_unique<ChatTranscript>(ChatTranscript::load(settings_.chat, t.transcript));
  } catch (const Error& err) {
    return finish(e, SampleStatus::EnvFailed, EnvError::Infra,
                  fmt::format("restored from its snapshot, but its checkpointed chat transcript does not load: {}",
                              err.what()));
  }
  e.reward_sum = t.reward_sum;
  e.last_reward = t.last_reward;
  e.env_snapshot = t.env_snapshot;
  e.budget = response_budget(s.prompt_length);
  if (t.open_turn >= 0) return continue_turn(e, t.open_turn);  // the turn under way, from its tokens so far
  // The last turn was waiting for its reply, which the checkpoint did not hold: sent again.
  if (t.turn_ends.back() > e.budget)  // this job's limits (the KV cache, max_seq_len) are smaller than the recording job's
    return finish(e, SampleStatus::Truncated, EnvError::Overlong,
                  fmt::format("resumed, its turn {} ends at response token {}, past this job's budget of {}",
                              t.turn_ends.size(), t.turn_ends.back(), e.budget));
  const auto at = s.tokens.begin() + s.prompt_length;
  bool on_end_of_turn = false;
  e.turn_start = t.turn_starts.back();
  send_step(e, make_action(e, std::vector<int64_t>(at + t.turn_starts.back(), at + t.turn_ends.back()),
                           t.turn_stopped.back() != 0, &on_end_of_turn));
}

void EpisodeRunner::diverged(Episode& e, const std::string& why) {
  e.replay.reset();
  finish(e, SampleStatus::EnvFailed, EnvError::Infra,
         "resumed from a checkpoint by replaying its turns (environment " + env_.info().name +
             " declares itself deterministic), but " + why);
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
  const std::string id = e.id;
  env_.close(id);
  --open_in_env_;
  finished_.push_back(std::move(s));
  episodes_.erase(id);  // e is gone
}

}  // namespace slimpi
