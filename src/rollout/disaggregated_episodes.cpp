#include "rollout/disaggregated_episodes.h"

#include <slimpi/error.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/timer.h"
#include "parallel/mpi_bytes.h"
#include "parallel/posted_sends.h"
#include "parallel/watchdog.h"
#include "rollout/disaggregated_router.h"
#include "rollout/episode_runner.h"
#include "rollout/kv_transfer.h"

namespace slimpi {
namespace {

constexpr int kTagContext = 125;    // decode -> prefill engine: int64 (ticket, decode rank, tokens...); () = done
constexpr int kTagContextKv = 126;  // prefill -> decode engine: one encoded KvTransfer (group_index = the ticket)

const std::string kPrefillWait = "[pd episodes] a prefill engine waiting for contexts";
const std::string kPrefillSends = "[pd episodes] completing a prefill engine's sends of KV rows";
const std::string kDecodeWait = "[pd episodes] a decode engine waiting for its contexts' KV rows";
const std::string kDecodeSends = "[pd episodes] completing a decode engine's sends of contexts";
const std::string kCallEnd = "[pd episodes] the end of a routing call";

// A prefill engine: contexts from the decode engines in, their KV rows back to the engine
// that sent each, until every decode engine has said it is done.
void serve_contexts(Engine& engine, MPI_Comm comm, int n_decode, EngineStats& pd) {
  std::map<int64_t, int> sender;  // ticket -> its decode rank
  PostedSends sends(comm, kPrefillSends);
  int done = 0;
  while (done < n_decode || engine.has_work()) {
    while (done < n_decode && (message_waiting(comm, MPI_ANY_SOURCE, kTagContext) || !engine.has_work())) {
      const std::vector<int64_t> m = int64_values(recv_message(comm, MPI_ANY_SOURCE, kTagContext, kPrefillWait));
      if (m.empty()) {
        ++done;
        continue;
      }
      SLIMPI_CHECK(m.size() >= 3, "pd episodes: a context message of {} values (ticket, rank, tokens...)", m.size());
      GenerationRequest context;
      context.group_index = m[0];
      context.prompt.assign(m.begin() + 2, m.end());
      context.n_samples = 1;
      context.params.max_new_tokens = 1;  // (nothing samples here; admission counts the turn's next position)
      sender[m[0]] = int(m[1]);
      engine.add_request(context);
    }
    if (!engine.has_work()) continue;
    Stopwatch busy;
    engine.step();
    pd.prefill_busy_s += busy.seconds();
    for (auto& [context, kv] : engine.take_prefilled()) {
      Stopwatch send;
      auto it = sender.find(context.group_index);
      sends.post(encode_kv_transfer(kv), it->second, kTagContextKv);
      sender.erase(it);
      pd.kv_send_s += send.seconds();
    }
    sends.reap();
  }
  sends.flush();
}

// A decode engine's contexts at the prefill engines: each turn that opens one leaves as
// its tokens under a ticket unique in the call (a counter times the ranks, plus this
// rank), and enters the engine when its KV rows come back. A turn whose sequence is one
// already away (a group's samples opening the same context at once) sends nothing: it
// shares that ticket's rows.
class RemoteContexts : public ContextPrefill {
 public:
  RemoteContexts(Engine& engine, MPI_Comm comm, int n_decode, EngineStats& pd)
      : engine_(engine), comm_(comm), n_decode_(n_decode), pd_(pd), sends_(comm, kDecodeSends) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    outstanding_.assign(size_t(size_), 0);
  }

  void submit(const WorkItem& turn) override {
    SLIMPI_CHECK(!turn.is_group(), "pd episodes: group {} came as a context, not as an episode's turn",
                 turn.request.group_index);
    if (auto same = ticket_of_.find(turn.partial.tokens); same != ticket_of_.end()) {
      waiting_.at(same->second).sharers.push_back(turn);
      return;
    }
    const int64_t ticket = next_++ * size_ + rank_;
    int p = n_decode_;  // the prefill engine with the fewest of this engine's tokens outstanding
    for (int e = n_decode_; e < size_; ++e)
      if (outstanding_[size_t(e)] < outstanding_[size_t(p)]) p = e;
    std::vector<int64_t> message{ticket, rank_};
    message.insert(message.end(), turn.partial.tokens.begin(), turn.partial.tokens.end());
    sends_.post(int64_bytes(message), p, kTagContext);
    outstanding_[size_t(p)] += int64_t(turn.partial.tokens.size());
    waiting_.emplace(ticket, Away{turn, p, Stopwatch(), {}});
    ticket_of_.emplace(turn.partial.tokens, ticket);
    sends_.reap();
  }

  bool waiting() const { return !waiting_.empty(); }

  // The turns whose rows have come back, into the engine.
  void take_arrived() {
    while (message_waiting(comm_, MPI_ANY_SOURCE, kTagContextKv)) take_one();
    sends_.reap();
  }

  // Nothing else to run: sleeps up to 1 ms while no rows arrive (the runner's step that
  // follows sleeps only in a process environment's poll; an in-process one's returns at
  // once). A context that has waited past parallel.timeout_s ends the job, naming the
  // prefill rank that holds it (no blocking wait is under the watchdog here).
  void nap() {
    for (int i = 0; i < 5; ++i) {
      if (message_waiting(comm_, MPI_ANY_SOURCE, kTagContextKv)) return;  // (rows here: nothing waits too long)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    const double limit = Watchdog::instance().timeout_s();
    const auto& [ticket, oldest] = *waiting_.begin();  // (tickets grow with time)
    if (limit > 0 && oldest.since.seconds() > limit)
      SLIMPI_FAIL("{}: the context of group {} sample {} ({} tokens, ticket {}) has waited {:.0f} s for its KV rows "
                  "from prefill rank {} (parallel.timeout_s = {}): that rank is stuck or dead",
                  kDecodeWait, oldest.turn.request.group_index, oldest.turn.partial.index,
                  oldest.turn.partial.tokens.size(), ticket, oldest.since.seconds(), oldest.prefill, limit);
  }

  // Once the engine's episodes are over: every prefill engine is told this one is done.
  // (A turn waits for its rows only while its episode is open, so none is left here.)
  void finish() {
    SLIMPI_CHECK(waiting_.empty(), "pd episodes: {} context(s) still at the prefill engines after the last episode",
                 waiting_.size());
    for (int p = n_decode_; p < size_; ++p) sends_.post(std::string(), p, kTagContext);
    sends_.flush();
  }

 private:
  void take_one() {
    Stopwatch clock;
    KvTransfer kv = decode_kv_transfer(recv_message(comm_, MPI_ANY_SOURCE, kTagContextKv, kDecodeWait));
    auto it = waiting_.find(kv.group_index);
    SLIMPI_CHECK(it != waiting_.end(), "pd episodes: KV rows for ticket {}, which this engine did not send",
                 kv.group_index);
    Away away = std::move(it->second);
    waiting_.erase(it);
    ticket_of_.erase(away.turn.partial.tokens);
    outstanding_[size_t(away.prefill)] -= int64_t(away.turn.partial.tokens.size());
    for (const WorkItem& sharer : away.sharers) {
      KvTransfer copy = kv;
      copy.group_index = sharer.request.group_index;
      engine_.add_prefilled(sharer, std::move(copy));
    }
    kv.group_index = away.turn.request.group_index;
    engine_.add_prefilled(away.turn, std::move(kv));
    pd_.kv_receive_s += clock.seconds();
  }

  Engine& engine_;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1, n_decode_;
  EngineStats& pd_;
  PostedSends sends_;
  int64_t next_ = 0;
  struct Away {  // a turn at a prefill engine
    WorkItem turn;
    int prefill = -1;
    Stopwatch since;
    std::vector<WorkItem> sharers;  // turns of the same sequence, waiting for these rows too
  };
  std::vector<int64_t> outstanding_;                    // per rank (the prefill ranks' entries): tokens sent
  std::map<int64_t, Away> waiting_;                     // ticket -> its turn
  std::map<std::vector<int64_t>, int64_t> ticket_of_;   // an away turn's sequence -> its ticket
};

// What route_rollout runs on a decode rank: the episode runner, fed the turns whose rows
// have come back; it has work while a turn is away.
class DecodeEpisodes : public GroupWorker {
 public:
  DecodeEpisodes(EpisodeRunner& runner, RemoteContexts& remote, const Engine& engine, EngineStats& pd)
      : runner_(runner), remote_(remote), engine_(engine), pd_(pd) {}
  void add_request(const GenerationRequest& request) override { runner_.add_request(request); }
  bool has_work() const override { return runner_.has_work() || remote_.waiting(); }
  std::vector<Sample> step() override {
    remote_.take_arrived();
    if (!engine_.has_work() && remote_.waiting()) {
      remote_.nap();
      remote_.take_arrived();
    }
    const bool busy = engine_.has_work();  // (without work the runner's step waits for the environment)
    Stopwatch clock;
    std::vector<Sample> out = runner_.step();
    if (busy) pd_.decode_busy_s += clock.seconds();
    return out;
  }

 private:
  EpisodeRunner& runner_;
  RemoteContexts& remote_;
  const Engine& engine_;
  EngineStats& pd_;
};

}  // namespace

std::vector<Sample> route_disaggregated_episodes(Engine& engine, EpisodeRunner* episodes, MPI_Comm rollout,
                                                 int64_t n_prefill, int64_t max_running,
                                                 const std::vector<GenerationRequest>& requests,
                                                 const std::function<void(const RouterProgress&)>& on_progress,
                                                 EngineStats& pd) {
  const auto [rank, size, n_decode, prefill] = pd_ranks(rollout, n_prefill);
  SLIMPI_CHECK(prefill == (episodes == nullptr), "pd episodes: rollout rank {} is a {} engine {} an episode runner",
               rank, prefill ? "prefill" : "decode", prefill ? "with" : "without");
  MPI_Comm decode = MPI_COMM_NULL;  // the decode ranks, rollout rank 0 (the router) first
  check_mpi(MPI_Comm_split(rollout, prefill ? MPI_UNDEFINED : 0, rank, &decode), "MPI_Comm_split (decode engines)");
  Stopwatch wall;
  std::vector<Sample> results;
  if (prefill) {
    serve_contexts(engine, rollout, n_decode, pd);
    pd.prefill_wall_s += wall.seconds();
  } else {
    RemoteContexts remote(engine, rollout, n_decode, pd);
    episodes->set_context_prefill(&remote);
    struct Unset {
      EpisodeRunner* runner;
      ~Unset() { runner->set_context_prefill(nullptr); }
    } unset{episodes};
    DecodeEpisodes worker(*episodes, remote, engine, pd);
    results = route_rollout(worker, decode, max_running, requests, on_progress);
    remote.finish();
    pd.decode_wall_s += wall.seconds();
    MPI_Comm_free(&decode);
  }
  idle_barrier(rollout, kCallEnd);
  return results;
}

}  // namespace slimpi
