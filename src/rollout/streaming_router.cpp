#include "rollout/streaming_router.h"

#include <slimpi/error.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/byte_codec.h"
#include "core/sample_codec.h"
#include "core/timer.h"
#include "parallel/mpi_bytes.h"
#include "parallel/posted_sends.h"
#include "parallel/watchdog.h"
#include "rollout/episode_runner.h"
#include "rollout/router.h"

namespace slimpi {
namespace {

// Tags of their own: route_rollout's (101, 102) never share a call with these.
constexpr int kTagWork = 111;     // router -> engine: 'W' + items, or 'P' (pause)
constexpr int kTagSamples = 112;  // engine -> router: 'S' + finished samples, or 'A' (paused)
constexpr int kTagGather = 113;   // engine -> router, between runs: items

const std::string kEngineIdle = "[rollout] an engine waiting for work from the router (rollout rank 0)";
const std::string kRouterIdle = "[rollout] the router waiting for finished samples or a pause";
const std::string kRouterPausing =
    "[rollout] the router waiting for an engine (rank given in the rollout communicator) to pause";
const std::string kRouterGather =
    "[rollout] the router gathering the unfinished work of an engine (rank given in the rollout communicator)";
const std::string kPartialCounts = "[rollout] partial-rollout counts over the engines";
const std::string kSendsDone = "[rollout] completing this rank's sends of work or samples";

// Items travel as their request's identity (the sampling parameters are every rank's
// own), the partial sample, and an episode's prompt record and turns.
std::string encode_items(char kind, const std::vector<WorkItem>& items) {
  ByteWriter w;
  w.put(kind);
  w.put<uint64_t>(items.size());
  std::vector<Sample> partials;
  for (const auto& it : items) {
    w.put(it.request.group_index);
    w.put(it.request.n_samples);
    w.put(it.request.seed);
    w.put_vector(it.request.prompt);
    w.put<uint8_t>(it.record.has_value());
    if (it.record) {
      w.put(it.record->index);
      w.put(it.record->line);
      w.put<uint8_t>(it.record->chat);
      w.put_string(it.record->text);
      w.put_string(it.record->label);
      w.put_string(it.record->metadata);
      w.put_string(it.record->raw);
    }
    w.put_vector(it.episode.turn_starts);
    w.put_vector(it.episode.turn_ends);
    w.put_vector(it.episode.turn_stopped);
    w.put(it.episode.open_turn);
    w.put_string(it.episode.env_snapshot);
    w.put_string(it.episode.transcript);
    w.put<uint64_t>(it.episode.left_transcripts.size());
    for (const std::string& t : it.episode.left_transcripts) w.put_string(t);
    w.put_vector(it.episode.continued_from);
    w.put(it.episode.reward_sum);
    w.put(it.episode.last_reward);
    partials.push_back(it.partial);
  }
  w.put_string(encode_samples(partials));
  return w.take();
}

std::vector<WorkItem> decode_items(const std::string& bytes, const SamplingParams& params) {
  ByteReader r(bytes);
  r.get<char>();
  std::vector<WorkItem> items(r.get<uint64_t>());
  for (auto& it : items) {
    it.request.group_index = r.get<int64_t>();
    it.request.n_samples = r.get<int64_t>();
    it.request.seed = r.get<uint64_t>();
    it.request.prompt = r.get_vector<int64_t>();
    it.request.params = params;
    if (r.get<uint8_t>()) {
      Prompt& p = it.record.emplace();
      p.index = r.get<int64_t>();
      p.line = r.get<int64_t>();
      p.chat = r.get<uint8_t>() != 0;
      p.text = r.get_string();
      p.label = r.get_string();
      p.metadata = r.get_string();
      p.raw = r.get_string();
    }
    it.episode.turn_starts = r.get_vector<int64_t>();
    it.episode.turn_ends = r.get_vector<int64_t>();
    it.episode.turn_stopped = r.get_vector<int8_t>();
    it.episode.open_turn = r.get<int64_t>();
    it.episode.env_snapshot = r.get_string();
    it.episode.transcript = r.get_string();
    it.episode.left_transcripts.resize(r.get<uint64_t>());
    for (std::string& t : it.episode.left_transcripts) t = r.get_string();
    it.episode.continued_from = r.get_vector<int64_t>();
    it.episode.reward_sum = r.get<double>();
    it.episode.last_reward = r.get<double>();
  }
  std::vector<Sample> partials = decode_samples(r.get_string());
  SLIMPI_CHECK(r.done() && partials.size() == items.size(), "work message: {} items, {} partial samples",
               items.size(), partials.size());
  for (size_t i = 0; i < items.size(); ++i) items[i].partial = std::move(partials[i]);
  return items;
}

std::string samples_message(const std::vector<Sample>& samples) { return 'S' + encode_samples(samples); }

}  // namespace

const Registry<PartialPolicy>& partial_policies() {
  static const Registry<PartialPolicy> r("rollout.partial", {{"continue", PartialPolicy::Continue},
                                                            {"requeue", PartialPolicy::Requeue},
                                                            {"discard", PartialPolicy::Discard}});
  return r;
}

StreamingRouter::StreamingRouter(Engine& engine, EpisodeRunner* episodes, MPI_Comm rollout, int64_t max_running,
                                 SamplingParams params)
    : engine_(engine),
      episodes_(episodes),
      comm_(rollout),
      max_running_(max_running),
      params_(std::move(params)),
      sends_(rollout, kSendsDone) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  outstanding_tokens_.assign(size_t(size_), 0);
  outstanding_seqs_.assign(size_t(size_), 0);
}

int64_t StreamingRouter::item_tokens(const WorkItem& w) const {
  const int64_t seqs = w.is_group() ? w.request.n_samples : 1;
  return seqs * (static_cast<int64_t>(w.request.prompt.size()) + w.request.params.max_new_tokens);
}

GroupWorker& StreamingRouter::worker() { return episodes_ ? static_cast<GroupWorker&>(*episodes_) : engine_; }

void StreamingRouter::add_work(const WorkItem& w) {
  if (episodes_)
    episodes_->add_work(w);
  else
    engine_.add_work(w);
}

double StreamingRouter::run(const Hooks& hooks) {
  Stopwatch busy_clock;
  double busy = 0;
  for (const auto& w : parked_) engine_.add_work(w);  // an episode's parked turn goes back to the engine too
  parked_.clear();
  if (episodes_) episodes_->resume();
  struct PauseEpisodes {  // however run() returns
    EpisodeRunner* e;
    ~PauseEpisodes() {
      if (e) e->pause();
    }
  } pause_episodes{episodes_};
  if (!is_router()) {
    // An engine: take work, run, send finished samples back; stop on a pause.
    for (;;) {
      while (!worker().has_work() || message_waiting(comm_, 0, kTagWork)) {
        const std::string msg = recv_message(comm_, 0, kTagWork, kEngineIdle);
        if (msg.at(0) == 'P') {  // every sample posted before goes ahead of the answer
          sends_.post("A", 0, kTagSamples);
          sends_.flush();
          engine_.release_group();
          return busy;
        }
        for (const auto& w : decode_items(msg, params_)) add_work(w);
      }
      busy_clock.restart();
      std::vector<Sample> done = worker().step();
      busy += busy_clock.seconds();
      if (!done.empty()) sends_.post(samples_message(done), 0, kTagSamples);
      sends_.reap();
    }
  }
  std::optional<WaitGuard> idle;  // held across a stretch of empty iterations
  auto nap = std::chrono::microseconds(50);
  while (!hooks.should_pause()) {
    dispatch(hooks);
    sends_.reap();
    bool worked = false;
    if (worker().has_work()) {
      idle.reset();
      busy_clock.restart();
      std::vector<Sample> done = worker().step();
      busy += busy_clock.seconds();
      receive_samples(std::move(done), 0, hooks);
      worked = true;
    }
    MPI_Status status;
    int flag = 0;
    while (check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, kTagSamples, comm_, &flag, &status), "MPI_Iprobe"), flag) {
      const std::string msg = recv_message(comm_, status.MPI_SOURCE, kTagSamples, kRouterIdle);
      SLIMPI_CHECK(msg.at(0) == 'S', "engine {} sent '{}' while running", status.MPI_SOURCE, msg.at(0));
      receive_samples(decode_samples(msg.substr(1)), status.MPI_SOURCE, hooks);
      worked = true;
    }
    if (worked && hooks.after_iteration) hooks.after_iteration();
    if (worked) {
      idle.reset();
      nap = std::chrono::microseconds(50);
      continue;
    }
    if (!idle) idle.emplace(WaitInfo{&kRouterIdle, "MPI_Iprobe (asleep between probes)"});
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
  }
  idle.reset();
  pause_engines(hooks);
  engine_.release_group();  // a tensor-parallel engine's followers return from follow()
  return busy;
}

void StreamingRouter::dispatch(const Hooks& hooks) {
  std::vector<std::vector<WorkItem>> assign(static_cast<size_t>(size_));
  for (;;) {
    std::optional<WorkItem> item;
    if (!todo_.empty()) {
      item = todo_.front();
    } else {
      item = hooks.next_group();
      if (!item) break;
      open_[item->request.group_index] = item->request.n_samples;
      todo_.push_back(*item);
    }
    const int64_t seqs = item->is_group() ? item->request.n_samples : 1;
    const int best = least_loaded_engine(outstanding_tokens_, outstanding_seqs_, seqs, max_running_);
    if (best < 0) break;  // every engine is full; the item waits at the front
    todo_.pop_front();
    outstanding_seqs_[best] += seqs;
    outstanding_tokens_[best] += item_tokens(*item);
    seq_tokens_[item->request.group_index] = item_tokens(*item) / seqs;
    assign[best].push_back(std::move(*item));
  }
  for (const auto& w : assign[0]) add_work(w);
  for (int e = 1; e < size_; ++e)
    if (!assign[e].empty()) sends_.post(encode_items('W', assign[e]), e, kTagWork);
}

void StreamingRouter::receive_samples(std::vector<Sample> samples, int engine, const Hooks& hooks) {
  for (auto& s : samples) {
    const int64_t g = s.group_index;
    const auto n = open_.find(g);
    SLIMPI_CHECK(n != open_.end(), "engine {} returned sample {} of group {}, which is not open", engine, s.index, g);
    outstanding_seqs_[engine] -= 1;
    outstanding_tokens_[engine] -= seq_tokens_.at(g);  // as dispatched (an episode's context may differ)
    auto& group = assembling_[g];
    group.push_back(std::move(s));
    if (int64_t(group.size()) < n->second) continue;
    std::vector<Sample> whole = std::move(group);
    assembling_.erase(g);
    seq_tokens_.erase(g);
    open_.erase(n);
    std::sort(whole.begin(), whole.end(), [](const auto& a, const auto& b) { return a.index < b.index; });
    hooks.on_group(std::move(whole));
  }
}

void StreamingRouter::pause_engines(const Hooks& hooks) {
  for (int e = 1; e < size_; ++e) sends_.post("P", e, kTagWork);  // behind any work posted to e
  // Samples an engine finished before it saw the pause arrive ahead of its 'A'
  // (messages between two ranks with one tag do not overtake each other).
  for (int e = 1; e < size_; ++e)
    for (;;) {
      const std::string msg = recv_message(comm_, e, kTagSamples, kRouterPausing);
      if (msg.at(0) == 'A') break;
      receive_samples(decode_samples(msg.substr(1)), e, hooks);
    }
  sends_.flush();  // every engine has taken its work and the pause
}

std::vector<WorkItem> StreamingRouter::gather_items(const std::vector<WorkItem>& mine) {
  if (!is_router()) {
    send_message(comm_, encode_items('G', mine), 0, kTagGather);
    return {};
  }
  std::vector<WorkItem> all = mine;
  for (int e = 1; e < size_; ++e)
    for (auto& w : decode_items(recv_message(comm_, e, kTagGather, kRouterGather), params_)) all.push_back(std::move(w));
  return all;
}

PartialStats StreamingRouter::update_weights(int64_t version, PartialPolicy policy) {
  // An episode's state is its environment's on this rank: its turn stays here (the deck check refuses the rest).
  SLIMPI_CHECK(!episodes_ || policy == PartialPolicy::Continue,
               "rollout: episodes in flight continue across weight updates (rollout.partial = \"continue\") only");
  std::vector<WorkItem> items = std::move(parked_);
  parked_.clear();
  for (auto& w : engine_.take_in_flight()) items.push_back(std::move(w));
  engine_.on_weights_updated(version);
  int64_t counts[4] = {0, 0, 0, 0};  // continued, requeued, discarded, discarded tokens
  auto restart = [&](WorkItem& w) {  // a partial sample back to its prompt
    if (w.is_group() || w.response_length() == 0) return;
    counts[2] += 1;
    counts[3] += w.response_length();
    Sample fresh;
    fresh.group_index = w.partial.group_index;
    fresh.index = w.partial.index;
    fresh.tokens = w.request.prompt;
    fresh.prompt_length = static_cast<int64_t>(w.request.prompt.size());
    w.partial = std::move(fresh);
  };
  switch (policy) {
    case PartialPolicy::Continue:
      for (const auto& w : items) counts[0] += !w.is_group();
      parked_ = std::move(items);
      break;
    case PartialPolicy::Discard:
      for (auto& w : items) restart(w);
      if (is_router())  // work queued here (requeued or restored) starts again too
        for (auto& w : todo_) restart(w);
      parked_ = std::move(items);
      break;
    case PartialPolicy::Requeue: {
      for (const auto& w : items) counts[1] += !w.is_group();
      std::vector<WorkItem> all = gather_items(items);
      for (auto& w : all) todo_.push_back(std::move(w));
      std::fill(outstanding_seqs_.begin(), outstanding_seqs_.end(), 0);
      std::fill(outstanding_tokens_.begin(), outstanding_tokens_.end(), 0);
      break;
    }
  }
  {
    WaitGuard guard({&kPartialCounts, "MPI_Reduce", 4, "i64", 0});
    MPI_Reduce(is_router() ? MPI_IN_PLACE : counts, counts, 4, MPI_INT64_T, MPI_SUM, 0, comm_);
  }
  PartialStats stats;
  if (is_router()) stats = {counts[0], counts[1], counts[2], counts[3]};
  return stats;
}

StreamState StreamingRouter::snapshot() {
  std::vector<WorkItem> mine = parked_;
  for (auto& w : engine_.in_flight()) mine.push_back(std::move(w));
  if (episodes_) mine = episodes_->snapshot(mine);  // the turns, as parts of their episodes
  StreamState state;
  state.work = gather_items(mine);
  if (!is_router()) return state;
  state.work.insert(state.work.begin(), todo_.begin(), todo_.end());
  for (const auto& [g, samples] : assembling_) state.finished.insert(state.finished.end(), samples.begin(), samples.end());
  return state;
}

void StreamingRouter::restore(StreamState state) {
  for (auto it = state.work.rbegin(); it != state.work.rend(); ++it) {
    it->request.params = params_;
    open_[it->request.group_index] = it->request.n_samples;
    todo_.push_front(std::move(*it));
  }
  for (auto& s : state.finished) {
    SLIMPI_CHECK(open_.count(s.group_index), "restored sample {} of group {} has no unfinished work beside it",
                 s.index, s.group_index);
    assembling_[s.group_index].push_back(std::move(s));
  }
}

}  // namespace slimpi
