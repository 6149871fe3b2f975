// BatchScorer — the one place where generated responses get their rewards: it collects
// (prompt, response) pairs and scores them in one call of the reward style
// (reward/reward.h: a command style starts one process per call), the rewards in the
// order the samples were added. The synchronous rounds (driver/step_phases.cpp), the
// full-async generator (driver/async_generator.cpp) and evaluation
// (rollout/rollout_side.cpp) all score through it. Owned by the caller for one batch.
#pragma once

#include <slimpi/sample.h>

#include <vector>

#include "reward/reward.h"

namespace slimpi {

class Tokenizer;
struct Prompt;

class BatchScorer {
 public:
  BatchScorer(const RewardConfig& reward, const Tokenizer& tokenizer) : reward_(reward), tokenizer_(tokenizer) {}
  // Queues sample `s` (a response to `prompt`) for the next score().
  void add(const Prompt& prompt, const Sample& s);
  size_t size() const { return inputs_.size(); }
  // The rewards of everything added since the last call, in that order.
  std::vector<float> score();

 private:
  const RewardConfig& reward_;
  const Tokenizer& tokenizer_;
  std::vector<RewardInput> inputs_;
};

}  // namespace slimpi
