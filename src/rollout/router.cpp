#include "rollout/router.h"

#include <slimpi/error.h>

#include <algorithm>
#include <map>
#include <type_traits>
#include <vector>

#include "core/byte_codec.h"
#include "core/sample_codec.h"
#include "parallel/watchdog.h"
#include "parallel/mpi_bytes.h"
#include "rollout/group_assembler.h"

namespace slimpi {
namespace {

constexpr int kTagAssign = 101;  // router -> engine: int64 group indices ([] = done)
constexpr int kTagResult = 102;  // engine -> router: encoded samples of finished groups

const std::string kEngineWait = "[router] an engine waiting for work";
const std::string kRouterWait = "[router] waiting for an engine's results";

// An engine rank: take assignments from the router, run, send back whole groups; stop
// on an empty assignment.
void serve_assignments(GroupWorker& engine, MPI_Comm rollout, const std::vector<GenerationRequest>& requests,
                       const std::map<int64_t, size_t>& by_group, GroupAssembler& assembler) {
  bool done = false;
  while (!done || engine.has_work()) {
    while (!done && (message_waiting(rollout, 0, kTagAssign) || !engine.has_work())) {
      const std::vector<int64_t> groups = int64_values(recv_message(rollout, 0, kTagAssign, kEngineWait));
      if (groups.empty()) done = true;
      for (int64_t g : groups) engine.add_request(requests.at(by_group.at(g)));
    }
    if (!engine.has_work()) continue;
    for (auto& group : assembler.add(engine.step())) send_message(rollout, encode_samples(group), 0, kTagResult);
  }
}

}  // namespace

std::vector<Sample> route_rollout(GroupWorker& engine, MPI_Comm rollout, int64_t max_running,
                                           const std::vector<GenerationRequest>& requests,
                                           const std::function<void(const RouterProgress&)>& on_progress) {
  int rank = 0, size = 1;
  MPI_Comm_rank(rollout, &rank);
  MPI_Comm_size(rollout, &size);
  std::map<int64_t, size_t> by_group;
  for (size_t i = 0; i < requests.size(); ++i) by_group[requests[i].group_index] = i;
  GroupAssembler assembler(requests);

  if (rank != 0) {
    serve_assignments(engine, rollout, requests, by_group, assembler);
    return {};
  }

  // The router (also an engine).
  std::vector<int64_t> outstanding_tokens(size, 0), outstanding_seqs(size, 0);
  std::map<int64_t, int> owner;  // group -> engine
  std::vector<Sample> results;
  RouterProgress progress;
  progress.groups_total = static_cast<int64_t>(requests.size());
  size_t next = 0;
  auto finish_group = [&](std::vector<Sample>&& group) {
    const GenerationRequest& r = requests.at(by_group.at(group.front().group_index));
    const int e = owner.at(r.group_index);
    outstanding_tokens[e] -= request_tokens(r);
    outstanding_seqs[e] -= r.n_samples;
    for (auto& s : group) {
      progress.tokens_generated += s.response_length();
      results.push_back(std::move(s));
    }
    ++progress.groups_done;
  };
  while (progress.groups_done < progress.groups_total) {
    // Hand out groups while some engine is under its cap.
    std::vector<std::vector<int64_t>> assign(size);
    while (next < requests.size()) {
      const int best =
          least_loaded_engine(outstanding_tokens, outstanding_seqs, requests[next].n_samples, max_running);
      if (best < 0) break;
      owner[requests[next].group_index] = best;
      outstanding_tokens[best] += request_tokens(requests[next]);
      outstanding_seqs[best] += requests[next].n_samples;
      assign[best].push_back(requests[next].group_index);
      ++next;
    }
    for (int64_t g : assign[0]) engine.add_request(requests.at(by_group.at(g)));
    for (int e = 1; e < size; ++e)
      if (!assign[e].empty())
        send_message(rollout, int64_bytes(assign[e]), e, kTagAssign);

    const int64_t before = progress.groups_done;
    if (engine.has_work())
      for (auto& group : assembler.add(engine.step())) finish_group(std::move(group));
    // Results from other engines; block for one only when there is nothing to run here.
    while (message_waiting(rollout, MPI_ANY_SOURCE, kTagResult) ||
           (!engine.has_work() && progress.groups_done < progress.groups_total && next >= requests.size())) {
      auto group = decode_samples(recv_message(rollout, MPI_ANY_SOURCE, kTagResult, kRouterWait));
      finish_group(std::move(group));
      if (next < requests.size()) break;  // go hand out more
    }
    if (on_progress && progress.groups_done != before) on_progress(progress);
  }
  for (int e = 1; e < size; ++e) send_message(rollout, std::string(), e, kTagAssign);  // done
  sort_by_group_and_sample(results);
  return results;
}

int least_loaded_engine(const std::vector<int64_t>& outstanding_tokens, const std::vector<int64_t>& outstanding_seqs,
                        int64_t seqs, int64_t max_running) {
  int best = -1;
  for (int e = 0; e < int(outstanding_tokens.size()); ++e)
    if (outstanding_seqs[size_t(e)] + seqs <= 2 * max_running &&
        (best < 0 || outstanding_tokens[size_t(e)] < outstanding_tokens[size_t(best)]))
      best = e;
  return best;
}

int64_t request_tokens(const GenerationRequest& r) {
  return r.n_samples * (static_cast<int64_t>(r.prompt.size()) + r.params.max_new_tokens);
}

void sort_by_group_and_sample(std::vector<Sample>& samples) {
  std::sort(samples.begin(), samples.end(), [](const auto& a, const auto& b) {
    return std::tie(a.group_index, a.index) < std::tie(b.group_index, b.index);
  });
}

EngineStats sum_engine_stats(const EngineStats& mine, MPI_Comm comm) {
  std::vector<double> v;  // every counter as f64, in EngineStats::zip order
  EngineStats::zip(mine, mine, [&](const auto& c, const auto&) { v.push_back(double(c)); });
  static const std::string context = "[rollout] engine counters over the engines";
  WaitGuard guard({&context, "MPI_Allreduce", v.size(), "f64"});
  MPI_Allreduce(MPI_IN_PLACE, v.data(), int(v.size()), MPI_DOUBLE, MPI_SUM, comm);
  EngineStats sum;
  size_t i = 0;
  EngineStats::zip(sum, sum, [&](auto& c, auto&) { c = static_cast<std::decay_t<decltype(c)>>(v[i++]); });
  return sum;
}

}  // namespace slimpi
