#include "driver/async_generator.h"

#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <algorithm>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "buffer/dynamic_filter.h"
#include "ckpt/checkpoint_dir.h"
#include "core/log.h"
#include "core/timer.h"
#include "buffer/rollout_batch.h"
#include "io/rollout_log.h"
#include "kernels/counter_rng.h"
#include "parallel/mpi_bytes.h"
#include "parallel/watchdog.h"
#include "reward/batch_scorer.h"
#include "rollout/rollout_side.h"
#include "tokenizer/tokenizer.h"

namespace slimpi {
namespace {

nlohmann::json prompt_json(const Prompt& p) {
  return {{"index", p.index}, {"line", p.line},   {"text", p.text},         {"chat", p.chat},
          {"label", p.label}, {"metadata", p.metadata}, {"raw", p.raw}};
}

Prompt prompt_from(const nlohmann::json& j) {
  Prompt p;
  p.index = j.at("index");
  p.line = j.at("line");
  p.text = j.at("text");
  p.chat = j.at("chat");
  p.label = j.at("label");
  p.metadata = j.at("metadata");
  p.raw = j.value("raw", std::string());  // (absent from older checkpoints)
  return p;
}

}  // namespace

AsyncGenerator::AsyncGenerator(const Deck& deck, RolloutSide& side, PromptSource& prompts, const Tokenizer& tokenizer,
                               uint64_t run_seed)
    : deck_(deck),
      side_(side),
      prompts_(prompts),
      tokenizer_(tokenizer),
      filter_(dynamic_filters().get(deck.get_string("rollout.dynamic_filter"))),
      reward_(RewardConfig::from_deck(deck)),
      run_seed_(run_seed),
      batch_groups_(deck.get_int("rollout.rollout_batch_size")),
      queue_batches_(deck.get_int("rollout.queue_batches")),
      n_samples_(side.config().n_samples_per_prompt),
      mask_offpolicy_(deck.get_bool("rollout.mask_offpolicy_in_partial")),
      partial_(partial_policies().get(deck.get_string("rollout.partial"))),
      queue_(deck.get_int("rollout.max_staleness"), deck.get_string("rollout.stale_policy") == "regenerate", counts_) {
  // A synchronous step generates at most max_sampling_rounds rounds of
  // over_sampling_batch_size (or rollout_batch_size) groups: the same bound per batch here,
  // wherever groups can be left out (the dynamic filter; an environment that fails
  // episodes: one that fails them all must not stall the run).
  const int64_t per_round = deck.get_int("rollout.over_sampling_batch_size") > 0
                                ? deck.get_int("rollout.over_sampling_batch_size")
                                : batch_groups_;
  max_groups_per_batch_ = filter_.is_identity() && !side.config().env.enabled()
                              ? std::numeric_limits<int64_t>::max()
                              : deck.get_int("rollout.max_sampling_rounds") * per_round;
}

void AsyncGenerator::run_stream(const std::function<bool()>& should_pause) {
  Stopwatch clock;
  if (side_.is_follower()) {  // a tensor-parallel engine's rank: its leader's forwards, for the run
    busy_s_ += side_.follow();
    stream_s_ += clock.seconds();
    return;
  }
  const EngineStats before = side_.stream().engine_stats();
  busy_s_ += side_.stream().run(hooks(should_pause));
  score_finished();  // what came back while the engines paused
  streamed_ += side_.stream().engine_stats() - before;
  stream_s_ += clock.seconds();
}

bool AsyncGenerator::is_router() const { return side_.is_router(); }

StreamingRouter::Hooks AsyncGenerator::hooks(std::function<bool()> should_pause) {
  StreamingRouter::Hooks h;
  h.should_pause = std::move(should_pause);
  h.next_group = [this] { return next_group(); };
  h.on_group = [this](std::vector<Sample> samples) { on_group(std::move(samples)); };
  h.after_iteration = [this] { score_finished(); };
  return h;
}

std::optional<WorkItem> AsyncGenerator::next_group() {
  // Work ahead by at most queue_batches batches: queued and open groups together.
  const int64_t ahead = queue_.n_groups() + side_.stream().open_groups();
  if (ahead >= queue_batches_ * batch_groups_) return std::nullopt;
  std::optional<Prompt> redraw = queue_.next_redraw();
  Prompt p = redraw ? std::move(*redraw) : prompts_.next(1).front();
  WorkItem w;
  w.request.group_index = next_group_++;
  w.request.prompt = prompt_token_ids(tokenizer_, p);
  w.request.n_samples = n_samples_;
  w.request.params = side_.config().sampling;
  w.request.seed = mix_seed(run_seed_, kFullAsyncStream, uint64_t(w.request.group_index));
  if (side_.config().env.enabled()) w.record = p;  // the episodes' resets need it on whichever engine
  open_prompts_[w.request.group_index] = std::move(p);
  return w;
}

void AsyncGenerator::on_group(std::vector<Sample> samples) {
  const int64_t g = samples.front().group_index;
  unscored_.push_back({std::move(open_prompts_.at(g)), std::move(samples)});
  open_prompts_.erase(g);
}

void AsyncGenerator::score_finished() {
  if (unscored_.empty()) return;
  Stopwatch clock;
  BatchScorer scorer(reward_, tokenizer_);
  for (const auto& group : unscored_)
    for (const auto& s : group.samples) scorer.add(group.prompt, s);
  const std::vector<float> r = scorer.score();
  score_s_ += clock.seconds();
  busy_s_ += clock.seconds();  // the router's work, as its engine iterations are
  size_t next = 0;
  for (auto& group : unscored_) {
    ++groups_finished_;
    std::vector<float> group_rewards(r.begin() + long(next), r.begin() + long(next + group.samples.size()));
    for (auto& s : group.samples) s.raw_reward = r[next++];
    // A group with an episode its environment failed is not trained (as in the synchronous
    // loop: the failed reward says nothing about the policy), nor counted as filtered.
    const bool env_failed = any_episode_failed(group.samples.begin(), group.samples.end());
    const bool kept = !env_failed && filter_.keep(group_rewards);
    if (!kept && !env_failed) ++groups_filtered_;
    if (env_failed) ++groups_env_failed_;
    queue_.add(std::move(group), kept, step_);
  }
  unscored_.clear();
}

void AsyncGenerator::generate_while_training(int64_t next_step, MPI_Request* trainers_done) {
  step_ = next_step;
  run_stream([trainers_done] {
    int done = 0;
    check_mpi(MPI_Test(trainers_done, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  });
  static const std::string context = "[rollout] the engines paused: waiting for the trainers' signal";
  WaitGuard guard({&context, "MPI_Wait (Ibarrier)"});
  check_mpi(MPI_Wait(trainers_done, MPI_STATUS_IGNORE), "MPI_Wait");
}

std::map<std::string, double> AsyncGenerator::take_batch(int64_t step, RolloutBatch& batch) {
  batch = RolloutBatch();
  step_ = step;
  if (is_router()) queue_.retire_stale(step);  // what became stale since it was queued
  run_stream([this] { return queue_.n_groups() >= batch_groups_ || groups_finished_ >= max_groups_per_batch_; });
  if (!side_.is_follower()) batch.engine_stats = sum_engine_stats(streamed_, side_.engines());
  batch.generate_s = stream_s_;
  streamed_ = EngineStats();
  stream_s_ = 0;
  if (!is_router()) return {};
  std::map<std::string, double> m = counts_;
  const int64_t n_groups = std::min<int64_t>(batch_groups_, queue_.n_groups());
  if (n_groups < batch_groups_ && !said_short_batch_) {
    log::warn("step {}: {} of {} groups to train: {} groups finished since the last batch ({} dropped by the dynamic "
              "filter, {} with an episode the environment failed), and the bound (rollout.max_sampling_rounds x "
              "over_sampling_batch_size or rollout_batch_size = {}) was reached; training on those. Said once: "
              "rollout/short_batch_groups in metrics.h5 counts every short batch",
              step + 1, n_groups, batch_groups_, groups_finished_, groups_filtered_, groups_env_failed_,
              max_groups_per_batch_);
    said_short_batch_ = true;
  }
  const int64_t partial_samples = queue_.take(n_groups, step, mask_offpolicy_, batch);
  batch.groups_generated = groups_finished_;
  batch.groups_dropped = groups_filtered_;
  batch.score_s = score_s_;
  m["rollout/async/partial_samples"] = double(partial_samples);
  m["rollout/async/ready_groups"] = double(queue_.n_groups());
  m["rollout/async/open_groups"] = double(side_.stream().open_groups());
  for (const char* k : {"rollout/async/stale_dropped_groups", "rollout/async/stale_regenerated_groups",
                        "rollout/async/partial_continued", "rollout/async/partial_requeued",
                        "rollout/async/partial_discarded", "rollout/async/partial_discarded_tokens"})
    m.emplace(k, 0.0);
  counts_.clear();
  groups_finished_ = groups_filtered_ = groups_env_failed_ = 0;
  score_s_ = 0;
  return m;
}

void AsyncGenerator::update_weights(int64_t version) {
  if (side_.is_follower()) return side_.set_weight_version(version);  // the leader decides for its work
  const PartialStats p = side_.stream().update_weights(version, partial_);
  side_.set_weight_version(version);
  counts_["rollout/async/partial_continued"] += double(p.continued);
  counts_["rollout/async/partial_requeued"] += double(p.requeued);
  counts_["rollout/async/partial_discarded"] += double(p.discarded);
  counts_["rollout/async/partial_discarded_tokens"] += double(p.discarded_tokens);
}

double AsyncGenerator::take_busy_seconds() {
  const double s = busy_s_;
  busy_s_ = 0;
  return s;
}

const std::vector<std::string>& AsyncGenerator::checkpoint_files() {
  static const std::vector<std::string> files = {"async_queue.h5", "async_work.h5", "async_state.json"};
  return files;
}

StreamState AsyncGenerator::snapshot() { return side_.is_follower() ? StreamState() : side_.stream().snapshot(); }

int64_t AsyncGenerator::save(const std::string& dir, StreamState state) {
  if (!is_router()) return 0;
  SLIMPI_CHECK(unscored_.empty(), "async checkpoint: {} finished groups not scored yet", unscored_.size());
  // async_queue.h5: the queued groups' samples (kept part), then the unrecorded ones.
  std::vector<Sample> queued;
  nlohmann::json queued_prompts = nlohmann::json::array(), open = nlohmann::json::object();
  for (const auto& g : queue_.groups()) {
    queued.insert(queued.end(), g.samples.begin(), g.samples.end());
    queued_prompts.push_back(prompt_json(g.prompt));
  }
  {
    RolloutLog log = RolloutLog::create(dir + "/async_queue.h5", MPI_COMM_NULL, deck_.to_toml());
    log.append(queued, queue_.unused());
    log.flush();
  }
  h5::check_no_failed_close();  // the destructor's close must have landed too
  // async_work.h5: every unfinished item (a group not started: index -1, its prompt as
  // tokens), then the samples of unfinished groups already back.
  std::vector<Sample> work;
  nlohmann::json episode_turns = nlohmann::json::array();  // an episode's turns per work item (null: none)
  for (const auto& w : state.work) {
    if (w.episode.empty()) {
      episode_turns.push_back(nullptr);
    } else {
      nlohmann::json t = {{"starts", w.episode.turn_starts}, {"ends", w.episode.turn_ends},
                          {"stopped", w.episode.turn_stopped}, {"open_turn", w.episode.open_turn}};
      if (!w.episode.env_snapshot.empty()) {  // the environment's state, the transcript, the rewards so far
        t.update({{"env_snapshot", nlohmann::json::parse(w.episode.env_snapshot)},
                  {"transcript", nlohmann::json::parse(w.episode.transcript)},
                  {"reward_sum", w.episode.reward_sum},
                  {"last_reward", w.episode.last_reward}});
        if (!w.episode.continued_from.empty()) {  // its threads (null: a context it cannot resume)
          nlohmann::json left = nlohmann::json::array();
          for (const std::string& s : w.episode.left_transcripts)
            left.push_back(s.empty() ? nlohmann::json() : nlohmann::json::parse(s));
          t.update({{"left_transcripts", left}, {"continued_from", w.episode.continued_from}});
        }
      }
      episode_turns.push_back(std::move(t));
    }
    Sample s = w.partial;
    if (w.is_group()) {
      s.group_index = w.request.group_index;
      s.index = -1;
      s.tokens = w.request.prompt;
      s.prompt_length = static_cast<int64_t>(w.request.prompt.size());
    }
    work.push_back(std::move(s));
  }
  {
    RolloutLog log = RolloutLog::create(dir + "/async_work.h5", MPI_COMM_NULL, deck_.to_toml());
    log.append(work, state.finished);
    log.flush();
  }
  h5::check_no_failed_close();
  for (const auto& [g, p] : open_prompts_) open[std::to_string(g)] = prompt_json(p);
  nlohmann::json redraw = nlohmann::json::array();
  for (const auto& p : queue_.redraws()) redraw.push_back(prompt_json(p));
  const nlohmann::json j = {{"n_samples_per_prompt", n_samples_},
                            {"max_new_tokens", side_.config().sampling.max_new_tokens},
                            {"next_group", next_group_},
                            {"queued_groups", queue_.groups().size()},
                            {"queued_prompts", queued_prompts},
                            {"unused_samples", queue_.unused().size()},
                            {"work_items", work.size()},
                            {"episode_turns", episode_turns},
                            {"finished_samples", state.finished.size()},
                            {"open_prompts", open},
                            {"redraw_prompts", redraw},
                            {"counts", counts_},
                            {"groups_finished", groups_finished_},
                            {"groups_filtered", groups_filtered_},
                            {"groups_env_failed", groups_env_failed_}};
  ckpt::write_checkpoint_file(dir + "/async_state.json", j.dump(1) + "\n");
  return queue_.n_groups() + static_cast<int64_t>(open_prompts_.size());
}

namespace {

// An episode's turns as async_state.json holds them (with an environment's snapshot,
// its transcript and rewards when it takes snapshots).
WorkItem::EpisodeTurns episode_turns_from(const nlohmann::json& t) {
  WorkItem::EpisodeTurns e;
  e.turn_starts = t.at("starts").get<std::vector<int64_t>>();
  e.turn_ends = t.at("ends").get<std::vector<int64_t>>();
  e.turn_stopped = t.at("stopped").get<std::vector<int8_t>>();
  e.open_turn = t.at("open_turn");
  if (t.contains("env_snapshot")) {
    e.env_snapshot = t.at("env_snapshot").dump();
    e.transcript = t.at("transcript").dump();
    e.reward_sum = t.at("reward_sum");
    e.last_reward = t.at("last_reward");
    if (t.contains("continued_from")) {
      e.continued_from = t.at("continued_from").get<std::vector<int64_t>>();
      for (const nlohmann::json& s : t.at("left_transcripts")) e.left_transcripts.push_back(s.is_null() ? "" : s.dump());
    }
  }
  return e;
}

// The kept groups waiting for their batch, the unused samples and the prompts to draw
// again: async_queue.h5's samples split as async_state.json (j) counts them.
void restore_queue(GroupQueue& queue, const std::string& dir, const nlohmann::json& j, int64_t n_samples) {
  std::vector<Sample> queued = RolloutLog::open(dir + "/async_queue.h5", MPI_COMM_NULL, false).read_all();
  const size_t n_queued = j.at("queued_groups").get<size_t>() * size_t(n_samples);
  SLIMPI_CHECK(n_queued + j.at("unused_samples").get<size_t>() == queued.size(),
               "{}/async_queue.h5 holds {} samples; async_state.json says {} queued groups and {} unused samples",
               dir, queued.size(), j.at("queued_groups").get<size_t>(), j.at("unused_samples").get<size_t>());
  std::deque<GroupQueue::Group> groups;
  for (size_t k = 0; k < j.at("queued_groups").get<size_t>(); ++k) {
    GroupQueue::Group g{prompt_from(j.at("queued_prompts").at(k)), {}};
    for (int64_t i = 0; i < n_samples; ++i) g.samples.push_back(std::move(queued[k * size_t(n_samples) + size_t(i)]));
    groups.push_back(std::move(g));
  }
  std::vector<Sample> unused(std::make_move_iterator(queued.begin() + long(n_queued)),
                             std::make_move_iterator(queued.end()));
  std::deque<Prompt> redraws;
  for (const auto& p : j.at("redraw_prompts")) redraws.push_back(prompt_from(p));
  queue.restore(std::move(groups), std::move(unused), std::move(redraws));
}

}  // namespace

void AsyncGenerator::load(const std::string& dir) {
  const std::string path = dir + "/async_state.json";
  std::ifstream in(path);
  SLIMPI_CHECK(in, "{} is missing: the checkpoint was not written by a run with train.async = \"full\"", path);
  const nlohmann::json j = nlohmann::json::parse(in);
  // The unfinished work continues as it was asked for: n samples a group, up to this many tokens.
  const int64_t n = j.at("n_samples_per_prompt"), max_new = j.at("max_new_tokens");
  SLIMPI_CHECK(n == n_samples_ && max_new == side_.config().sampling.max_new_tokens,
               "{} holds groups of {} samples of up to {} new tokens under way; this deck asks for "
               "rollout.n_samples_per_prompt = {} ({}) and rollout.max_new_tokens = {} ({}): resume with the "
               "checkpoint's values",
               path, n, max_new, n_samples_, deck_.source("rollout.n_samples_per_prompt"),
               side_.config().sampling.max_new_tokens, deck_.source("rollout.max_new_tokens"));
  next_group_ = j.at("next_group");
  counts_ = j.at("counts").get<std::map<std::string, double>>();
  groups_finished_ = j.at("groups_finished");
  groups_filtered_ = j.at("groups_filtered");
  groups_env_failed_ = j.value("groups_env_failed", int64_t(0));  // absent from checkpoints before it was counted
  restore_queue(queue_, dir, j, n_samples_);
  for (const auto& [g, p] : j.at("open_prompts").items()) open_prompts_[std::stoll(g)] = prompt_from(p);
  std::vector<Sample> all = RolloutLog::open(dir + "/async_work.h5", MPI_COMM_NULL, false).read_all();
  const size_t n_work = j.at("work_items");
  SLIMPI_CHECK(n_work + j.at("finished_samples").get<size_t>() == all.size(),
               "{}/async_work.h5 holds {} samples; async_state.json says {} items and {} finished samples", dir,
               all.size(), n_work, j.at("finished_samples").get<size_t>());
  StreamState state;
  if (side_.config().env.enabled()) {
    SLIMPI_CHECK(j.contains("episode_turns"), "{} has no episode_turns: the turns of the episodes under way are "
                 "missing (the file was edited, or not written by a run with an environment)", path);
    SLIMPI_CHECK(j.at("episode_turns").size() == n_work, "{}: episode_turns holds {} entries for {} work items", path,
                 j.at("episode_turns").size(), n_work);
  }
  for (size_t i = 0; i < all.size(); ++i) {
    Sample& s = all[i];
    SLIMPI_CHECK(open_prompts_.count(s.group_index), "{}/async_work.h5: group {} has no prompt in async_state.json",
                 dir, s.group_index);
    if (i >= n_work) {
      state.finished.push_back(std::move(s));
      continue;
    }
    WorkItem w;
    w.request.group_index = s.group_index;
    w.request.prompt = s.prompt();
    w.request.n_samples = n_samples_;
    w.request.params = side_.config().sampling;
    w.request.seed = mix_seed(run_seed_, kFullAsyncStream, uint64_t(s.group_index));
    if (side_.config().env.enabled()) {  // an episode: its context is its reset's; the group's prompt is the record's
      w.record = open_prompts_.at(s.group_index);
      w.request.prompt = prompt_token_ids(tokenizer_, *w.record);
      if (const nlohmann::json& t = j.at("episode_turns").at(i); !t.is_null()) w.episode = episode_turns_from(t);
    }
    if (s.index >= 0) w.partial = std::move(s);
    state.work.push_back(std::move(w));
  }
  side_.stream().restore(std::move(state));
}

}  // namespace slimpi
