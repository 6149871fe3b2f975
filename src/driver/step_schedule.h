// StepSchedule — the order of one step's phases for a train.async mode, and what that
// mode holds between steps. One per mode, each in its own file, chosen once from the
// deck through the step_schedules() registry (keyed by train.async):
//   "off"           schedule_sync.cpp: eval rollout reward buffer train record weight_sync
//                   (train.mode = "sft" too: eval train record)
//   "one_step_off"  schedule_one_step_off.cpp: weight_sync eval buffer rollout ‖ reward ‖
//                   train record — the rollout ranks generate step k+1's batch with step
//                   k's weights while the trainers train on step k's (slime's --async)
//   "full"          schedule_full_async.cpp: the same table; the rollout ranks never stop
//                   generating, and the batch comes from a queue of finished groups
// The Driver runs the listed phases, then its own two (metrics, checkpoint). A schedule
// composes the phase bodies of StepPhases; it owns what crosses a step boundary (the
// pending batch, the async generator) and writes it into checkpoints.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/registry.h"

namespace slimpi {

class StepPhases;

class StepSchedule {
 public:
  struct Phase {
    const char* name;
    bool used;  // false: this mode skips it every step (said once at start-up)
    std::function<void(int64_t step)> body;
  };
  virtual ~StepSchedule() = default;
  // The phases of a step before metrics and checkpoint, in order.
  virtual std::vector<Phase> phases() = 0;
  // Checkpoint: writes what the schedule holds between steps into `dir` (collective;
  // a failure on one rank stops every rank under `context`). Returns the groups it
  // holds, the same on every rank (run_state.h5 keeps the count).
  virtual int64_t save_in_flight(const std::string& /*dir*/, const std::string& /*context*/) { return 0; }
  // The files save_in_flight wrote, for the checkpoint's manifest.
  virtual std::vector<std::string> in_flight_files(int64_t /*pending_groups*/) const { return {}; }
  // Resume: continues from what save_in_flight wrote.
  virtual void load_in_flight(const std::string& /*dir*/, int64_t /*pending_groups*/) {}
  // After the last step, before the final evaluation: the engines take the last weights
  // where they lag a step behind.
  virtual void before_final_eval(int64_t /*steps*/) {}
};

using StepScheduleFactory = std::function<std::unique_ptr<StepSchedule>(StepPhases& phases)>;
const Registry<StepScheduleFactory>& step_schedules();

// The factories, one per schedule file.
std::unique_ptr<StepSchedule> make_sync_schedule(StepPhases& phases);
std::unique_ptr<StepSchedule> make_one_step_off_schedule(StepPhases& phases);
std::unique_ptr<StepSchedule> make_full_async_schedule(StepPhases& phases);

}  // namespace slimpi
