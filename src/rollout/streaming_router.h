// StreamingRouter — the rollout ranks' generator under train.async = "full": work
// streams from the router (rollout rank 0, also an engine) to every engine of the
// rollout communicator, and finished samples stream back, across calls.
//
// run() returns when the router's `should_pause` says so, at an engine-iteration
// boundary on every rank, with sequences still in flight in the engines; the next
// run() continues them. Between runs, collectively on every rollout rank:
//   update_weights  new weights reach the engines; rollout.partial decides what
//                   happens to the sequences in flight (PartialPolicy below);
//   snapshot        a copy of all unfinished work on the router (checkpoints);
// and on the router alone, restore() puts checkpointed work back ahead of new groups.
// Dispatch is route_rollout's: the next item goes to the engine with the fewest
// outstanding tokens among those under 2·max_running outstanding sequences. Engines
// send back the samples each iteration finished; the router assembles whole groups,
// whatever engines their samples ran on, and hands each to `on_group` in sample order.
// Work and samples travel both ways at once, so neither side sends blocking (a large
// message waits for its receive): sends are posted (MPI_Isend) and completed while the
// sender goes on receiving. Waits sleep (growing naps up to 1 ms) under the watchdog:
// a rank with nothing to do leaves its core to the ranks that work.
// With rollout.environment the work is episodes: each engine rank's EpisodeRunner takes
// the items (whole groups, or single episodes to resume) and steps the engine; a weight
// update parks the engine's turns as it parks any partial sample (continue only: the
// environment's state of an episode lives on its rank), and snapshot() gives whole
// episodes (EpisodeRunner::snapshot), which restore() may send to any engine.
// Owned by RolloutSide on rollout ranks; the engine and the episode runner are RolloutSide's.
#pragma once

#include <mpi.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "core/registry.h"
#include "parallel/posted_sends.h"
#include "rollout/engine.h"

namespace slimpi {

class EpisodeRunner;

// Seeds and episode ids of train.async = "full" groups: a stream of their own (training
// steps use 0.., evaluation 2^40..).
constexpr uint64_t kFullAsyncStream = uint64_t(1) << 41;

// What new weights do to a sequence in flight (rollout.partial):
//   Continue  it stays in its engine; its KV is recomputed under the new weights and it
//             goes on; the tokens it has keep their log-probs and versions;
//   Requeue   it is taken out of its engine and queued on the router behind the work
//             already there, its partial response kept, then continued wherever it lands;
//   Discard   its response so far is thrown away and it starts again from its prompt.
// A group not forked yet has no response: it stays (Continue, Discard) or is queued (Requeue).
enum class PartialPolicy { Continue, Requeue, Discard };
// rollout.partial's names: "continue", "requeue", "discard".
const Registry<PartialPolicy>& partial_policies();

struct PartialStats {  // summed over the engines
  int64_t continued = 0;         // partial samples kept in their engine, KV to recompute
  int64_t requeued = 0;          // partial samples moved to the router's queue
  int64_t discarded = 0;         // partial samples restarted from their prompt
  int64_t discarded_tokens = 0;  // response tokens thrown away by those restarts
};

// Unfinished work: items to run, and samples of unfinished groups already back.
struct StreamState {
  std::vector<WorkItem> work;
  std::vector<Sample> finished;
};

class StreamingRouter {
 public:
  struct Hooks {  // called on the router only
    std::function<bool()> should_pause;                   // asked between iterations
    std::function<std::optional<WorkItem>()> next_group;  // a new group to start, or none for now
    std::function<void(std::vector<Sample>)> on_group;    // a whole group, sample order
    std::function<void()> after_iteration;                // optional: after each iteration's results
  };
  // episodes: the rank's episode runner over `engine` (rollout.environment), or null.
  StreamingRouter(Engine& engine, EpisodeRunner* episodes, MPI_Comm rollout, int64_t max_running,
                  SamplingParams params);

  // Collective: engines run until the router pauses them. Returns the seconds this
  // rank spent on engine iterations.
  double run(const Hooks& hooks);
  // Collective, between runs: the engines take `version`; in-flight work per `policy`.
  // The counts are summed on the router (zero elsewhere).
  PartialStats update_weights(int64_t version, PartialPolicy policy);
  // Collective, between runs: every unfinished item and sample, gathered on the router
  // (the engines keep theirs).
  StreamState snapshot();
  // Router: checkpointed work, run before any new group.
  void restore(StreamState state);
  // Router: groups started and not yet whole (queued, in an engine, or partly back).
  int64_t open_groups() const { return static_cast<int64_t>(open_.size()); }
  const EngineStats& engine_stats() const { return engine_.stats(); }

 private:
  bool is_router() const { return rank_ == 0; }
  GroupWorker& worker();               // what steps: the episode runner, or the engine
  void add_work(const WorkItem& w);    // new or restored work for this rank's worker
  void dispatch(const Hooks& hooks);
  void receive_samples(std::vector<Sample> samples, int engine, const Hooks& hooks);
  void pause_engines(const Hooks& hooks);
  // Every engine's `items` on the router (engine order); empty elsewhere.
  std::vector<WorkItem> gather_items(const std::vector<WorkItem>& mine);
  int64_t item_tokens(const WorkItem& w) const;

  Engine& engine_;
  EpisodeRunner* episodes_;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  int64_t max_running_;
  SamplingParams params_;          // every item's (requests travel without them)
  std::vector<WorkItem> parked_;   // this engine's work between update_weights and run
  PostedSends sends_;              // work and samples in flight (neither side sends blocking)
  // Router only.
  std::deque<WorkItem> todo_;                          // to dispatch before new groups
  std::vector<int64_t> outstanding_tokens_, outstanding_seqs_;  // per engine
  std::map<int64_t, int64_t> open_;                    // group -> n_samples
  std::map<int64_t, int64_t> seq_tokens_;              // group -> outstanding tokens a sequence of it counts
  std::map<int64_t, std::vector<Sample>> assembling_;  // group -> samples back so far
};

}  // namespace slimpi
