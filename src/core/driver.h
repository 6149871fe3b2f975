// Driver — `slimpi run`: walks the step table of DESIGN.md §2 for run.n_steps steps.
//
//   1 prompts  2 rollout  3 reward  4 buffer  5 train  6 weight_sync  7 metrics  8 checkpoint
//
// Owns the run's output files (rollouts.h5, metrics.h5/.csv) and, on trainer ranks,
// the policy and its Trainer. Every rank runs every phase call (a phase a rank has no
// part in costs it nothing); phases whose subsystem is not built yet are logged once
// as skipped. train.mode = "sft" fills the train phase with supervised steps on
// data.path (trainer ranks) and saves <run dir>/trainer_state.h5 at the end. Each
// phase is timed per rank; the metrics phase reduces the timings to rank 0 (max over
// ranks) and writes one row with them and the phases' metrics.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/run_context.h"
#include "core/timer.h"

namespace slimpi {

class Comm;
class MetricsLog;
class RolloutLog;
class SftData;
class Trainer;
class Transformer;

class Driver {
 public:
  explicit Driver(RunContext& ctx);
  ~Driver();
  // Runs every step; returns the number of steps done.
  int64_t run();

 private:
  struct Phase {
    const char* name;
    bool built;
    void (Driver::*body)(int64_t step);
  };
  void prompts(int64_t step);
  void rollout(int64_t step);
  void reward(int64_t step);
  void buffer(int64_t step);
  void train(int64_t step);
  void weight_sync(int64_t step);
  void metrics(int64_t step);
  void checkpoint(int64_t step);

  RunContext& ctx_;
  std::vector<Phase> phases_;
  std::unique_ptr<RolloutLog> rollouts_;
  std::unique_ptr<MetricsLog> metrics_;
  void set_up_training();

  std::unique_ptr<Transformer> policy_;   // trainer ranks
  std::unique_ptr<Comm> trainer_comm_;    // trainer ranks: data-parallel communicator
  std::unique_ptr<Trainer> trainer_;      // trainer ranks
  std::unique_ptr<SftData> sft_data_;     // trainer ranks, sft mode
  std::vector<struct Sample> step_samples_;  // this rank's finished samples of the step
  std::map<std::string, double> step_metrics_;  // the phases' metrics of the step (world rank 0's count)
  std::map<std::string, double> phase_times_;  // "time/<phase>_s" of this rank, this step
  Stopwatch step_clock_;                       // since the start of the current step
};

}  // namespace slimpi
