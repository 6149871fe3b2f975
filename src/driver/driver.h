// Driver — `slimpi run`: the step loop. Checks the deck (driver/check_run_deck.h),
// builds the run's components (driver/run_components.h), picks the step schedule of
// train.async (driver/step_schedule.h), resumes from a checkpoint when there is one,
// then runs run.n_steps steps (or until eval.stop_at_pass1 is reached):
//
//   <the schedule's phases, in its order>  metrics  checkpoint
//
// e.g. train.async = "off": eval rollout reward buffer train record weight_sync.
// metrics writes the step's row of metrics.h5 (every phase's metrics, perf/<phase>_time
// = the phase's time, max over ranks); checkpoint writes ckpt/step_XXXXXXXX/
// (ckpt/checkpoint_dir.h) every checkpoint.interval steps, at the last step, at
// run.job_steps, and when a SIGTERM/SIGUSR1 arrived during the step (the job then stops
// at this step boundary and exits 0). After the last step: a final evaluation (its row
// is step n_steps), trainer_state.h5 and the COMPLETE marker.
// Resume (driver_checkpoint.cpp): loads the trainer state, the engines' weights, the
// prompt cursor, every rank's RNG and what the schedule held between steps, and cuts
// rollouts.h5 and metrics.h5 back to the checkpoint's step, so that a resumed run
// continues bit for bit.
// Owns the run's output files, its components and its schedule.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "driver/run_components.h"
#include "driver/run_context.h"
#include "driver/step_schedule.h"

namespace slimpi {

class MetricsLog;
class RolloutLog;
class StepPhases;

class Driver {
 public:
  explicit Driver(RunContext& ctx);
  ~Driver();
  // Runs every step (or until eval.stop_at_pass1 is reached); returns the steps done.
  int64_t run();

 private:
  void metrics(int64_t step);
  void checkpoint(int64_t step);
  // After the last step: the final evaluation, trainer_state.h5, COMPLETE.
  void finish(int64_t steps);

  // Rank 0 picks the checkpoint to resume from (checkpoint.resume), checks it fits,
  // and on a fresh start moves the earlier run's files aside; sets resume_from_.
  void choose_resume();
  // Loads resume_from_ (if any) and opens or creates rollouts.h5 / metrics.h5.
  void resume_and_open_files();
  // Every rank's state from checkpoint `dir`: trainer, engines, prompt cursor, RNG, and
  // what the schedule held between steps.
  void load_checkpoint(const std::string& dir);
  void write_checkpoint(int64_t next_step);
  // A write to metrics.h5 / metrics.csv; a failure on any rank stops every rank.
  void log_metrics(const std::function<void()>& write);
  // <run dir>/COMPLETE (rank 0 writes it; every rank learns whether that worked).
  void mark_run_complete(int64_t steps);

  RunContext& ctx_;
  RunComponents parts_;
  std::unique_ptr<StepPhases> phases_;
  std::unique_ptr<StepSchedule> schedule_;
  std::vector<StepSchedule::Phase> step_table_;  // the schedule's phases, then metrics and checkpoint

  std::unique_ptr<RolloutLog> rollouts_;
  std::unique_ptr<MetricsLog> metrics_;
  bool halt_ = false;         // stop signal or run.job_steps: checkpoint and exit 0
  // A duplicate of the world used only to agree, after an error in the step loop, whether
  // every rank raised it (never freed: a pending agreement may hold it; MPI_Finalize does).
  MPI_Comm errors_ = MPI_COMM_NULL;
  int64_t start_step_ = 0;    // 0, or the step a checkpoint resumes at
  std::string ckpt_root_;     // checkpoint.dir or <run dir>/ckpt
  std::string resume_from_;   // the checkpoint this job continues, or "" (fresh)
};

}  // namespace slimpi
