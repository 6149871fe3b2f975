// StepPhases — the phase bodies a step schedule is made of (driver/step_schedule.h),
// over the run's components and the step in flight. Owned by the Driver, one per job;
// the schedules hold a reference. Every rank calls every phase (a rank with no part
// returns at once), so world-collective calls line up.
//
//   eval         held-out prompts at step 0 and every eval.interval steps (router scores)
//   rollout      generate_batch: rounds of draw / generate / score / filter until
//                rollout_batch_size groups are kept or max_sampling_rounds are spent
//   reward       postprocess_group_rewards: group post-processing of the kept groups (router)
//   buffer       hand_out: rollout metrics; each trainer gets its share of the kept samples
//   train        reference/old log-probs, KL, advantages (once per rollout), then
//                num_steps_per_rollout optimizer steps (train/trainer.h)
//   record       append_rollouts: rollouts.h5 gets the trained samples as trained and
//                the batch's untrained ones
//   weight_sync  push_weights: the policy's weights to the engines
// Debug modes: debug.rollout_only trains nothing; debug.train_only hands out the
// samples of debug.load_rollouts instead of generating (driver/replay_source.h).
#pragma once

#include <slimpi/sample.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "buffer/rollout_batch.h"
#include "core/timer.h"

namespace slimpi {

class AsyncGenerator;
class ReplaySource;
class RolloutLog;
struct RunComponents;
struct RunContext;

// What one step carries from phase to phase; cleared at each step's start.
struct StepState {
  RolloutBatch generated;     // generated this step (overlapped schedules: the next step's batch)
  std::vector<Sample> batch;  // trainers: their share of the trained batch's kept samples, then as trained
  std::map<std::string, double> metrics;      // the phases' metrics (world rank 0's count)
  std::map<std::string, double> phase_times;  // "time/<phase>_s" of this rank
  double generation_s = 0;                    // rollout ranks: this step's generation (any phase)
  Stopwatch clock;                            // since the step began
};

class StepPhases {
 public:
  StepPhases(RunContext& ctx, RunComponents& parts);
  ~StepPhases();

  RunContext& ctx() { return ctx_; }
  RunComponents& parts() { return parts_; }
  StepState& step() { return step_; }
  void begin_step();
  // The run's rollouts.h5 (opened once the resume point is known).
  void set_rollout_log(RolloutLog* log) { rollouts_ = log; }
  // eval.stop_at_pass1 was reached (by an evaluation, or by the run a checkpoint continues),
  // with eval/pass@1 = reached_pass1() (-1: not known, a checkpoint written before it was kept).
  bool reached_target() const { return reached_target_; }
  double reached_pass1() const { return reached_pass1_; }
  void set_reached_target(bool v, double pass1) {
    reached_target_ = v;
    reached_pass1_ = pass1;
  }
  int64_t n_short_batches() const { return n_short_batches_; }
  bool is_router() const;

  void eval(int64_t step);
  void run_eval(int64_t row);  // metrics row `row` (the final evaluation: run.n_steps)
  // Rollout ranks: the groups of the batch trained at `step` (seeds and Sample::step
  // follow it); the router keeps the samples, every rollout rank the counters.
  void generate_batch(int64_t step, RolloutBatch& out);
  void postprocess_group_rewards(RolloutBatch& batch);
  // The buffer phase for `batch`: rollout metrics (with `extra`, the router's), the
  // router's prompt cursor to every rank, and each trainer's share into step().batch.
  void hand_out(int64_t step, RolloutBatch& batch, const std::map<std::string, double>& extra = {});
  void train(int64_t step);
  // The record phase's write, after the schedule's barriers: step().batch as trained
  // and `untrained` (the trained batch's filtered, surplus and stale samples).
  void append_rollouts(const std::vector<Sample>& untrained);
  // Every rank takes the router's prompt cursor (overlapped schedules: the rollout
  // ranks drew the next batch's prompts).
  void follow_router_cursor(const std::string& context);
  // The policy's weights to the engines as `version` (split: bucketed broadcast; with
  // `async` the engines take them between iterations, rollout.partial applies).
  void push_weights(int64_t version, AsyncGenerator* async = nullptr);
  // Sends `values` from world rank `root` to every rank (merged into step().metrics).
  void share_metrics(int root, const std::map<std::string, double>& values);

 private:
  RunContext& ctx_;
  RunComponents& parts_;
  StepState step_;
  RolloutLog* rollouts_ = nullptr;
  std::unique_ptr<ReplaySource> replay_;  // debug.train_only
  bool reached_target_ = false;
  double reached_pass1_ = -1;
  bool said_short_batch_ = false;  // router: the short-batch warning is given once a job
  int64_t n_short_batches_ = 0;    // steps of this job that trained a short batch
};

}  // namespace slimpi
