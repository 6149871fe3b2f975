#include "rollout/disaggregated_router.h"

#include <slimpi/error.h>

#include <map>
#include <vector>

#include "core/sample_codec.h"
#include "core/timer.h"
#include "parallel/mpi_bytes.h"
#include "parallel/posted_sends.h"
#include "rollout/disaggregated_episodes.h"
#include "rollout/episode_runner.h"
#include "rollout/group_assembler.h"
#include "rollout/kv_transfer.h"

namespace slimpi {
namespace {

constexpr int kTagPrefill = 121;  // router -> prefill engine: (group, decode rank) int64 pairs ([] = done)
constexpr int kTagKv = 122;       // prefill engine -> decode engine: one encoded KvTransfer
constexpr int kTagResult = 123;   // decode engine -> router: encoded samples of a finished group
constexpr int kTagDone = 124;     // router -> decode engine: every group is back

const std::string kPrefillWait = "[pd router] a prefill engine waiting for prompts";
const std::string kDecodeWait = "[pd router] a decode engine waiting for prefilled prompts";
const std::string kRouterWait = "[pd router] waiting for prefilled prompts or an engine's results";
const std::string kRouterSends = "[pd router] completing the router's sends of prompts";
// Every rank leaves a call together: no message of the next call (the same group indices,
// as an evaluation's two calls have) can reach a rank still in this one.
const std::string kCallEnd = "[pd router] the end of a routing call";

// What every engine rank of the call shares: the requests by group.
struct CallRequests {
  const std::vector<GenerationRequest>& requests;
  std::map<int64_t, size_t> by_group;
  explicit CallRequests(const std::vector<GenerationRequest>& r) : requests(r) {
    for (size_t i = 0; i < r.size(); ++i) by_group[r[i].group_index] = i;
  }
  const GenerationRequest& at(int64_t group) const {
    auto it = by_group.find(group);
    SLIMPI_CHECK(it != by_group.end(), "pd router: group {} is not one of this call's", group);
    return requests[it->second];
  }
};

// A decode engine: one waiting KV transfer into the engine's queue.
void take_transfer(Engine& engine, MPI_Comm comm, const CallRequests& calls, EngineStats& pd) {
  Stopwatch clock;
  KvTransfer kv = decode_kv_transfer(recv_message(comm, MPI_ANY_SOURCE, kTagKv, kDecodeWait));
  WorkItem group;
  group.request = calls.at(kv.group_index);
  engine.add_prefilled(group, std::move(kv));
  pd.kv_receive_s += clock.seconds();
}

// A prefill engine: prompts from the router, KV to their decode engines; stops on [].
void serve_prefill(Engine& engine, MPI_Comm comm, const CallRequests& calls, EngineStats& pd) {
  std::map<int64_t, int> decode_rank;  // group -> where its KV goes
  bool done = false;
  while (!done || engine.has_work()) {
    while (!done && (message_waiting(comm, 0, kTagPrefill) || !engine.has_work())) {
      const std::vector<int64_t> pairs = int64_values(recv_message(comm, 0, kTagPrefill, kPrefillWait));
      if (pairs.empty()) done = true;
      for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
        decode_rank[pairs[i]] = int(pairs[i + 1]);
        engine.add_request(calls.at(pairs[i]));
      }
    }
    if (!engine.has_work()) continue;
    Stopwatch busy;
    engine.step();
    pd.prefill_busy_s += busy.seconds();
    for (auto& [request, kv] : engine.take_prefilled()) {
      Stopwatch send;
      send_message(comm, encode_kv_transfer(kv), decode_rank.at(request.group_index), kTagKv);
      pd.kv_send_s += send.seconds();
    }
  }
}

// A decode engine other than the router's: KV in, whole groups out, until the router's done.
void serve_decode(Engine& engine, MPI_Comm comm, const CallRequests& calls, GroupAssembler& assembler,
                  EngineStats& pd) {
  bool done = false;
  while (!done || engine.has_work()) {
    while (!done) {
      int tag = message_waiting(comm, MPI_ANY_SOURCE, kTagKv) ? kTagKv
                : message_waiting(comm, 0, kTagDone)           ? kTagDone
                                                                : -1;
      if (tag < 0 && engine.has_work()) break;
      if (tag < 0) tag = await_any_message(comm, MPI_ANY_SOURCE, {kTagKv, kTagDone}, kDecodeWait);
      if (tag == kTagKv) {
        take_transfer(engine, comm, calls, pd);
      } else {
        recv_message(comm, 0, kTagDone, kDecodeWait);
        done = true;
      }
    }
    if (!engine.has_work()) continue;
    Stopwatch busy;
    std::vector<Sample> finished = engine.step();
    pd.decode_busy_s += busy.seconds();
    for (auto& group : assembler.add(std::move(finished))) send_message(comm, encode_samples(group), 0, kTagResult);
  }
}

// The router (rollout rank 0, also a decode engine): hands each group to the least-loaded
// decode engine and the prefill engine with the fewest prompt tokens outstanding,
// decodes its own share, and collects every group's samples.
class PdRouter {
 public:
  PdRouter(Engine& engine, MPI_Comm rollout, int n_decode, int size, int64_t max_running,
           const std::vector<GenerationRequest>& requests, const CallRequests& calls, EngineStats& pd)
      : engine_(engine), rollout_(rollout), n_decode_(n_decode), size_(size), max_running_(max_running),
        requests_(requests), calls_(calls), pd_(pd), assembler_(requests), decode_tokens_(size_t(n_decode), 0),
        decode_seqs_(size_t(n_decode), 0), prefill_tokens_(size_t(size), 0), sends_(rollout, kRouterSends) {
    progress_.groups_total = static_cast<int64_t>(requests.size());
  }

  std::vector<Sample> run(const std::function<void(const RouterProgress&)>& on_progress) {
    while (progress_.groups_done < progress_.groups_total) {
      hand_out();
      while (message_waiting(rollout_, MPI_ANY_SOURCE, kTagKv)) take_transfer(engine_, rollout_, calls_, pd_);
      const int64_t before = progress_.groups_done;
      if (engine_.has_work()) {
        Stopwatch busy;
        std::vector<Sample> finished = engine_.step();
        pd_.decode_busy_s += busy.seconds();
        for (auto& group : assembler_.add(std::move(finished))) finish_group(std::move(group));
      }
      take_messages(/*block=*/!engine_.has_work());  // asleep only with nothing to run here
      if (on_progress && progress_.groups_done != before) on_progress(progress_);
    }
    for (int p = n_decode_; p < size_; ++p) sends_.post(std::string(), p, kTagPrefill);
    for (int d = 1; d < n_decode_; ++d) sends_.post(std::string(), d, kTagDone);
    sends_.flush();
    return std::move(results_);
  }

 private:
  // Groups to engines while a decode engine has room. Prompts go out posted: a prefill
  // engine may be sending this rank KV at the same time.
  void hand_out() {
    std::vector<std::vector<int64_t>> pairs(static_cast<size_t>(size_));
    while (next_ < requests_.size()) {
      const GenerationRequest& r = requests_[next_];
      const int d = least_loaded_engine(decode_tokens_, decode_seqs_, r.n_samples, max_running_);
      if (d < 0) break;
      int p = n_decode_;
      for (int e = n_decode_; e < size_; ++e)
        if (prefill_tokens_[size_t(e)] < prefill_tokens_[size_t(p)]) p = e;
      owner_[r.group_index] = {d, p};
      decode_tokens_[size_t(d)] += request_tokens(r);
      decode_seqs_[size_t(d)] += r.n_samples;
      prefill_tokens_[size_t(p)] += static_cast<int64_t>(r.prompt.size());
      pairs[size_t(p)].insert(pairs[size_t(p)].end(), {r.group_index, int64_t(d)});
      ++next_;
    }
    for (int p = n_decode_; p < size_; ++p)
      if (!pairs[size_t(p)].empty()) sends_.post(int64_bytes(pairs[size_t(p)]), p, kTagPrefill);
    sends_.reap();
  }

  // Other engines' results and this engine's prefilled prompts (waiting for one when `block`).
  void take_messages(bool block) {
    while (progress_.groups_done < progress_.groups_total) {
      int tag = message_waiting(rollout_, MPI_ANY_SOURCE, kTagResult) ? kTagResult
                : message_waiting(rollout_, MPI_ANY_SOURCE, kTagKv)   ? kTagKv
                                                                      : -1;
      if (tag < 0 && !block) break;
      if (tag < 0) tag = await_any_message(rollout_, MPI_ANY_SOURCE, {kTagResult, kTagKv}, kRouterWait);
      block = false;
      if (tag == kTagKv) {
        take_transfer(engine_, rollout_, calls_, pd_);
        continue;
      }
      finish_group(decode_samples(recv_message(rollout_, MPI_ANY_SOURCE, kTagResult, kRouterWait)));
      if (next_ < requests_.size()) break;  // go hand out more
    }
  }

  void finish_group(std::vector<Sample>&& group) {
    const GenerationRequest& r = calls_.at(group.front().group_index);
    const auto [d, p] = owner_.at(r.group_index);
    decode_tokens_[size_t(d)] -= request_tokens(r);
    decode_seqs_[size_t(d)] -= r.n_samples;
    prefill_tokens_[size_t(p)] -= static_cast<int64_t>(r.prompt.size());
    for (auto& s : group) {
      progress_.tokens_generated += s.response_length();
      results_.push_back(std::move(s));
    }
    ++progress_.groups_done;
  }

  Engine& engine_;
  MPI_Comm rollout_;
  int n_decode_, size_;
  int64_t max_running_;
  const std::vector<GenerationRequest>& requests_;
  const CallRequests& calls_;
  EngineStats& pd_;
  GroupAssembler assembler_;
  std::vector<int64_t> decode_tokens_, decode_seqs_;  // outstanding per decode engine
  std::vector<int64_t> prefill_tokens_;               // indexed by rank (the prefill ranks' entries)
  std::map<int64_t, std::pair<int, int>> owner_;      // group -> (decode rank, prefill rank)
  std::vector<Sample> results_;
  RouterProgress progress_;
  size_t next_ = 0;  // the next request to hand out
  PostedSends sends_;
};

}  // namespace

std::vector<Sample> route_disaggregated(Engine& engine, MPI_Comm rollout, int64_t n_prefill, int64_t max_running,
                                        const std::vector<GenerationRequest>& requests,
                                        const std::function<void(const RouterProgress&)>& on_progress,
                                        EngineStats& pd) {
  const auto [rank, size, n_decode, prefill] = pd_ranks(rollout, n_prefill);
  const CallRequests calls(requests);
  Stopwatch wall;
  if (prefill) {
    serve_prefill(engine, rollout, calls, pd);
    pd.prefill_wall_s += wall.seconds();
    idle_barrier(rollout, kCallEnd);
    return {};
  }
  if (rank != 0) {
    GroupAssembler assembler(requests);
    serve_decode(engine, rollout, calls, assembler, pd);
    pd.decode_wall_s += wall.seconds();
    idle_barrier(rollout, kCallEnd);
    return {};
  }
  std::vector<Sample> results = PdRouter(engine, rollout, n_decode, size, max_running, requests, calls, pd)
                                    .run(on_progress);
  pd.decode_wall_s += wall.seconds();
  idle_barrier(rollout, kCallEnd);
  sort_by_group_and_sample(results);
  return results;
}

std::vector<Sample> route_groups(Engine& engine, EpisodeRunner* episodes, bool episodic, MPI_Comm comm,
                                 int64_t n_prefill, int64_t max_running, const std::vector<GenerationRequest>& requests,
                                 const std::function<void(const RouterProgress&)>& on_progress, EngineStats& pd) {
  if (n_prefill > 0 && episodic)
    return route_disaggregated_episodes(engine, episodes, comm, n_prefill, max_running, requests, on_progress, pd);
  if (n_prefill > 0) return route_disaggregated(engine, comm, n_prefill, max_running, requests, on_progress, pd);
  SLIMPI_CHECK(!episodic || episodes, "router: a call of episodes on an engine rank without an episode runner");
  GroupWorker& worker = episodes ? static_cast<GroupWorker&>(*episodes) : engine;
  return route_rollout(worker, comm, max_running, requests, on_progress);
}

PdRanks pd_ranks(MPI_Comm rollout, int64_t n_prefill) {
  PdRanks r;
  MPI_Comm_rank(rollout, &r.rank);
  MPI_Comm_size(rollout, &r.size);
  r.n_decode = r.size - int(n_prefill);
  SLIMPI_CHECK(n_prefill >= 1 && r.n_decode >= 1, "prefill/decode disaggregation: {} prefill engines among {} "
               "rollout ranks (needs at least one of each)", n_prefill, r.size);
  r.prefill = is_prefill_rank(r.rank, r.size, n_prefill);
  return r;
}

EngineConfig engine_config_of_rank(EngineConfig cfg, int rank, int size, int64_t n_prefill) {
  cfg.prefill_only = n_prefill > 0 && is_prefill_rank(rank, size, n_prefill);
  return cfg;
}

}  // namespace slimpi
