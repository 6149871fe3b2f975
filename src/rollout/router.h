// Router — serves one step's prompt groups with every engine of the rollout
// communicator, handing groups out as engines have room, and gathers the samples.
//
// Rollout rank 0 routes (and runs an engine too). Every rank holds the same list of
// requests, so an assignment is just a group index. Dispatch is dynamic: the next
// group goes to the engine with the fewest outstanding tokens (Σ n·(prompt +
// max_new_tokens) of its unfinished groups) among those under the cap of
// 2·max_running outstanding sequences, so a slow engine never holds the step. Engines
// return whole groups; the result, on rollout rank 0 only, is ordered by (group,
// sample) whatever the assignment was, so the same deck gives the same rollouts with
// any number of engines. Collective over the rollout communicator.
#pragma once

#include <mpi.h>

#include <functional>
#include <vector>

#include "rollout/engine.h"

namespace slimpi {

struct RouterProgress {
  int64_t groups_done = 0;
  int64_t groups_total = 0;
  int64_t tokens_generated = 0;  // by all engines so far
};

// Returns every sample on rollout rank 0, nothing elsewhere. `engine` is this rank's
// worker: its Engine, or an EpisodeRunner over it (rollout/group_worker.h). `on_progress` runs on
// rank 0 each time groups come back.
std::vector<Sample> route_rollout(GroupWorker& engine, MPI_Comm rollout, int64_t max_running,
                                           const std::vector<GenerationRequest>& requests,
                                           const std::function<void(const RouterProgress&)>& on_progress = {});

// The dispatch rule every router shares (this one, the disaggregated and the streaming
// router): the engine with the fewest outstanding tokens among those that stay under
// 2·max_running outstanding sequences with `seqs` more; -1 when every engine is full.
// outstanding_tokens, outstanding_seqs: per engine.
int least_loaded_engine(const std::vector<int64_t>& outstanding_tokens, const std::vector<int64_t>& outstanding_seqs,
                        int64_t seqs, int64_t max_running);
// The tokens a group counts for while outstanding: n_samples · (prompt + max_new_tokens).
int64_t request_tokens(const GenerationRequest& r);
// A router's result order: by (group, sample), whatever engine ran them.
void sort_by_group_and_sample(std::vector<Sample>& samples);

// Collective over `comm`: every rank's engine counters summed (times too).
EngineStats sum_engine_stats(const EngineStats& mine, MPI_Comm comm);

}  // namespace slimpi
