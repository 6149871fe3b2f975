// EpisodeRunner, resume and replay (rollout/episode_runner.h): an episode checkpointed in
// flight comes back as a WorkItem (add_work); snapshot() makes those items. A
// deterministic environment's episode is reset again and sent its recorded turns, each
// reply checked against the record token for token (replay_turn, recorded_observation,
// matches_record; a difference: diverged); an environment that takes snapshots restores
// the episode instead (on_restored).
#include <slimpi/error.h>

#include <algorithm>
#include <map>
#include <utility>

#include "core/log.h"
#include "rollout/episode.h"
#include "rollout/episode_runner.h"

namespace slimpi {
namespace {

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
        w.episode.left_transcripts = e.left_transcripts;
        w.episode.continued_from = e.continued_from;
        w.episode.reward_sum = e.reward_sum;
        w.episode.last_reward = e.last_reward;
      }
    }
    out.push_back(std::move(w));
  }
  return out;
}

bool EpisodeRunner::replay_turn(Episode& e, int64_t r) {
  Episode::Replay& rp = *e.replay;
  if (rp.next < rp.turns.turn_ends.size()) {  // a turn it took before: sent again as it was
    const int64_t start = rp.turns.turn_starts[rp.next], end = rp.turns.turn_ends[rp.next];
    if (start != r || end <= start) {
      diverged(e, fmt::format("its turn {} began at response token {}, and would now begin at {}", rp.next + 1, start,
                              r));
      return true;
    }
    const int64_t copied = copied_tokens(e);
    if (end > e.budget + copied) {  // this job's limits (the KV cache, max_seq_len) are smaller than the recording job's
      finish(e, SampleStatus::Truncated, EnvError::Overlong,
             fmt::format("resumed, its turn {} ends at response token {}, past this job's budget of {}", rp.next + 1,
                         end - copied, e.budget));
      return true;
    }
    Sample turn = recorded_turn(rp.recorded, end);
    turn.status = rp.turns.turn_stopped[rp.next] ? SampleStatus::Completed : SampleStatus::Truncated;
    ++rp.next;
    e.turn_start = r;
    e.phase = Episode::Phase::Turn;
    on_turn(e, std::move(turn));
    return true;
  }
  // Caught up with the record: a turn under way continues in the engine from its tokens.
  const int64_t open = rp.turns.open_turn;
  SLIMPI_CHECK(open == r, "episodes: {} resumed with an open turn at response token {}, reached {}", e.id, open, r);
  adopt_recorded(e.sample, rp.recorded);  // the open turn's tokens so far, after r
  e.replay.reset();
  return false;
}

EpisodeRunner::RecordedSpan EpisodeRunner::recorded_observation(Episode& e) {
  const Episode::Replay& rp = *e.replay;
  RecordedSpan span;
  span.from = rp.turns.turn_ends[rp.next - 1];
  span.to = rp.next < rp.turns.turn_ends.size() ? rp.turns.turn_starts[rp.next] : rp.turns.open_turn;
  if (span.to < 0) e.replay.reset();  // the record ended waiting for this reply: caught up
  return span;
}

bool EpisodeRunner::matches_record(Episode& e, const std::vector<int64_t>& observation, bool new_context,
                                   const RecordedSpan& recorded) {
  const Sample& s = e.sample;
  const int64_t n = int64_t(observation.size()), r = s.response_length();
  const Sample& rec = e.replay->recorded;
  const auto at = rec.tokens.begin() + rec.prompt_length;
  if (recorded.from != r || recorded.to - recorded.from != n ||
      !std::equal(observation.begin(), observation.end(), at + recorded.from)) {
    diverged(e, fmt::format("its observation after turn {} is {} tokens that differ from the recorded {}",
                            s.env_turns, n, recorded.to - recorded.from));
    return false;
  }
  const bool recorded_new = std::find(rec.context_starts.begin(), rec.context_starts.end(), r) != rec.context_starts.end();
  if (new_context == recorded_new) return true;
  diverged(e, fmt::format("its observation after turn {} {} a new context, where the recorded one {}", s.env_turns,
                          new_context ? "opens" : "does not open", recorded_new ? "did" : "did not"));
  return false;
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
  // The threads it may resume: links within its contexts, each continuing an earlier one once.
  const size_t n_contexts = s.context_starts.size() + 1;
  bool links_ok = t.continued_from.size() <= n_contexts && t.left_transcripts.size() <= n_contexts;
  for (size_t c = 0; links_ok && c < t.continued_from.size(); ++c)
    links_ok = t.continued_from[c] < int64_t(c) &&
               (t.continued_from[c] < 0 ||
                std::count(t.continued_from.begin(), t.continued_from.end(), t.continued_from[c]) == 1);
  if (!links_ok)
    return finish(e, SampleStatus::EnvFailed, EnvError::Infra,
                  fmt::format("restored from its snapshot, but its checkpointed thread links ({} for {} contexts) are "
                              "not links between its contexts", t.continued_from.size(), n_contexts));
  e.left_transcripts = t.left_transcripts;
  e.continued_from = t.continued_from;
  const int64_t copied = copied_tokens(e);
  e.budget = response_budget(s.prompt_length);
  if (t.open_turn >= 0) return continue_turn(e, t.open_turn);  // the turn under way, from its tokens so far
  // The last turn was waiting for its reply, which the checkpoint did not hold: sent again.
  if (t.turn_ends.back() > e.budget + copied)  // this job's limits (the KV cache, max_seq_len) are smaller than the recording job's
    return finish(e, SampleStatus::Truncated, EnvError::Overlong,
                  fmt::format("resumed, its turn {} ends at response token {}, past this job's budget of {}",
                              t.turn_ends.size(), t.turn_ends.back() - copied, e.budget));
  const auto at = s.tokens.begin() + s.prompt_length;
  std::string sampled_end;  // (the transcript holds it already)
  e.turn_start = t.turn_starts.back();
  send_step(e, make_action(e, std::vector<int64_t>(at + t.turn_starts.back(), at + t.turn_ends.back()),
                           t.turn_stopped.back() != 0, &sampled_end));
}

void EpisodeRunner::diverged(Episode& e, const std::string& why) {
  e.replay.reset();
  finish(e, SampleStatus::EnvFailed, EnvError::Infra,
         "resumed from a checkpoint by replaying its turns (environment " + env_.info().name +
             " declares itself deterministic), but " + why);
}

}  // namespace slimpi
