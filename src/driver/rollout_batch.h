// RolloutBatch — one step's rollouts on their way from the engines to the trainers:
// the kept groups' samples with their rewards, the ones generated but not trained, and
// the counters its rollout metrics come from. Filled by the driver's rollout and reward
// phases (samples on the router; counters on every rollout rank), handed out by buffer,
// logged by record; under train.async = "one_step_off" it waits a step in between
// (Driver::pending_), and a checkpoint stores it.
#pragma once

#include <slimpi/sample.h>

#include <cstdint>
#include <vector>

#include "rollout/engine.h"

namespace slimpi {

struct RolloutBatch {
  std::vector<Sample> kept;    // generated samples of the kept groups, group order (rewards set)
  std::vector<Sample> unused;  // generated, not trained: filtered groups and surplus (status set)
  EngineStats engine_stats;    // summed over the engines
  int64_t groups_generated = 0, groups_dropped = 0, rounds = 0;
  double score_s = 0;          // router: time spent in the reward style, over all rounds
  double generate_s = 0;       // rollout ranks: wall time of its rounds (generation and scoring)
};

}  // namespace slimpi
