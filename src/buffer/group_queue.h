// GroupQueue — train.async = "full"'s rollout buffer, on the router: the finished groups
// the dynamic filter kept, in finishing order, waiting for the batch that trains them,
// and the generated samples that will not be trained (filtered, stale) until the next
// batch records them. Owned by the AsyncGenerator (driver/async_generator.h), which
// scores groups as they finish, and checkpointed by it (async_queue.h5).
// Staleness (rollout.max_staleness, -1 = none): a group whose oldest token is more than
// max_staleness weight versions behind the step about to train it is never trained: it
// is retired with status Stale, and with rollout.stale_policy = "regenerate" its prompt
// waits to be drawn again (next_redraw) as a new group.
// Counts (rollout/async/stale_dropped_groups, stale_regenerated_groups) go into the
// owner's counter map.
#pragma once

#include <slimpi/sample.h>

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "data/prompt_source.h"

namespace slimpi {

struct RolloutBatch;

class GroupQueue {
 public:
  struct Group {
    Prompt prompt;
    std::vector<Sample> samples;  // raw rewards set
  };
  GroupQueue(int64_t max_staleness, bool regenerate_stale, std::map<std::string, double>& counts)
      : max_staleness_(max_staleness), regenerate_stale_(regenerate_stale), counts_(counts) {}

  // A scored group that finished before `step` trains: kept by the filter -> queued (or
  // retired when already stale); not kept -> unused, status Filtered (an episode the
  // environment failed keeps its EnvFailed, reward NaN).
  void add(Group group, bool kept, int64_t step);
  // Retires the queued groups that are stale at `step`.
  void retire_stale(int64_t step);
  int64_t n_groups() const { return static_cast<int64_t>(ready_.size()); }
  // The first n queued groups' samples into batch.kept and every unused sample into
  // batch.unused, with Sample::step = step. mask_offpolicy: tokens of a sample older than
  // its newest leave the loss (loss_mask 0). Returns the trained samples whose tokens
  // are of more than one weight version.
  int64_t take(int64_t n, int64_t step, bool mask_offpolicy, RolloutBatch& batch);
  // A stale prompt to draw again first, if any.
  std::optional<Prompt> next_redraw();

  // Checkpoint: what the queue holds, and back.
  const std::deque<Group>& groups() const { return ready_; }
  const std::vector<Sample>& unused() const { return unused_; }
  const std::deque<Prompt>& redraws() const { return redraw_; }
  void restore(std::deque<Group> groups, std::vector<Sample> unused, std::deque<Prompt> redraws);

 private:
  bool is_stale(const std::vector<Sample>& samples, int64_t step) const;
  void retire(Group group);  // recorded as Stale; drawn again with "regenerate"

  int64_t max_staleness_;
  bool regenerate_stale_;
  std::map<std::string, double>& counts_;
  std::deque<Group> ready_;      // kept, fresh when queued, in finishing order
  std::vector<Sample> unused_;   // generated, not to be trained, not yet recorded
  std::deque<Prompt> redraw_;    // stale prompts to draw again first
};

}  // namespace slimpi
