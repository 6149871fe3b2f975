// ReplaySource — slime's debug.train_only: no generation; training step s replays the
// samples of step s in debug.load_rollouts (a rollouts.h5), split over the trainers
// exactly as the router split them (trainer i of T: rows [i·N/T, (i+1)·N/T) of the
// step), with the recorded rewards, rollout log-probs and sampling supports; the
// trainers recompute old/reference log-probs, KL and advantages. With the same deck
// and trainer count it reproduces the recorded run's train/* metrics exactly, and its
// rollouts.h5 holds the trained rows again with what this replay computed.
// (debug.rollout_only, the other debug mode, is a flag of the step phases: rollouts
// and rewards are produced and logged, nothing trains.)
// Owned by StepPhases when debug.train_only is set; the file is opened at first use,
// on trainer ranks.
#pragma once

#include <slimpi/sample.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace slimpi {

class RolloutLog;
struct RunComponents;
struct RunContext;

class ReplaySource {
 public:
  ReplaySource(const RunContext& ctx, const RunComponents& parts, std::string path);
  ~ReplaySource();
  // Collective over the world: this trainer's share of the recorded samples of `step`
  // (nothing on other ranks); a missing step or a bad sample stops every rank.
  std::vector<Sample> trainer_share(int64_t step);

 private:
  const RunContext& ctx_;
  const RunComponents& parts_;
  std::string path_;
  std::unique_ptr<RolloutLog> recorded_;
};

}  // namespace slimpi
