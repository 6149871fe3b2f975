// GroupWorker — what the router hands prompt groups to on each engine rank: the engine
// itself (single-turn rollouts: one response per sample), or an EpisodeRunner over it
// (rollout.environment: one multi-turn episode per sample, rollout/episode_runner.h).
// add_request queues a group; step() does one unit of work (an engine iteration, and
// for episodes the environment's replies) and returns the samples that finished in it.
#pragma once

#include <slimpi/sample.h>

#include <vector>

#include "rollout/request.h"

namespace slimpi {

class GroupWorker {
 public:
  virtual ~GroupWorker() = default;
  virtual void add_request(const GenerationRequest& request) = 0;
  virtual bool has_work() const = 0;
  virtual std::vector<Sample> step() = 0;
};

}  // namespace slimpi
