// Driver — `slimpi run`: walks the step table of DESIGN.md §2 for run.n_steps steps.
//
//   eval  rollout  reward  buffer  train  record  weight_sync  metrics  checkpoint
//
// train.mode = "rl":
//   rollout      rounds of: draw prompts, generate their groups on every engine, score
//                them (router), apply rollout.dynamic_filter — until
//                rollout_batch_size groups are kept or max_sampling_rounds are spent
//   reward       group post-processing of the kept groups' rewards (router)
//   buffer       rollout metrics; each trainer gets its share of the kept samples
//   train        reference/old log-probs, KL, advantages, whitening (once per rollout),
//                then num_steps_per_rollout optimizer steps
//   record       rollouts.h5: the trained samples as trained (each trainer appends its
//                share), then the filtered and surplus ones (router)
//   weight_sync  the weights go to the engines (split: bucketed broadcast over `sync`;
//                colocate: the engines run the trainer's own model)
// train.async = "one_step_off" (split placement): the rollout ranks generate step k+1's
// batch with the weights of step k while the trainers train on step k's batch, which
// was generated during step k-1 (slime's --async one-step-off; staleness 1, batch 0 is
// generated first with the initial weights). The step table becomes
//   weight_sync  eval  buffer  rollout ‖ reward ‖ train  record  metrics  checkpoint
// (weight_sync first: the engines get step k's weights before generating batch k+1;
// rollout and reward run on the rollout ranks while train runs on the trainers; record
// joins them). The schedule is a function of the deck only: seeds follow the batch's
// step, so two runs give the same files whatever the timing. A checkpoint holds the
// generated-but-untrained batch (pending_rollout.h5 + .json, ckpt/checkpoint_dir.h) and
// a resume trains it, bit for bit as a straight run.
// train.async = "full" (split placement; driver/async_generator.h) keeps that step table
// but the rollout ranks never finish a batch and stop: in `rollout` they generate until
// the trainers, done training, enter an MPI_Ibarrier (record); the engines pause at
// their next iteration with sequences in flight; `weight_sync` hands them the new
// weights (rollout.partial decides what the sequences in flight do); `buffer` takes
// the next batch from the queue of finished groups, generating first if it is short.
// Not deterministic (how far generation gets during training is timing); a checkpoint
// holds the queue and every unfinished sequence, so that no sample is lost or trained
// twice across a restart.
// train.mode = "sft": supervised steps on data.path; the rollout phases are idle.
// [eval] runs on held-out prompts before the first step and every eval.interval steps,
// and once more after the last (its row is step n_steps). Every rank calls every
// phase (a rank with no part returns at once), so world-collective calls line up;
// perf/<phase>_time is the phase's time, max over ranks.
//
// Checkpoint/restart (driver_checkpoint.cpp): the `checkpoint` phase writes
// ckpt/step_XXXXXXXX/ (ckpt/checkpoint_dir.h) every checkpoint.interval steps, at the
// last step, at run.job_steps, and when a SIGTERM/SIGUSR1 arrived during the step
// (the job then stops at this step boundary and exits 0). At start-up the driver
// resumes from checkpoint.resume: it loads the trainer state, the engines' weights,
// the prompt cursor and every rank's RNG, and cuts rollouts.h5 and metrics.h5 back to
// the checkpoint's step, so that a resumed run continues bit for bit.
// Debug modes (driver_replay.cpp): debug.rollout_only never trains; debug.train_only
// trains step s on the samples of step s recorded in debug.load_rollouts.
// Owns the run's output files and every per-rank component below.
#pragma once

#include <c10/core/ScalarType.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "driver/run_context.h"
#include "tokenizer/tokenizer.h"
#include "core/timer.h"

namespace slimpi {

class AsyncGenerator;
class Comm;
class ExpertGroups;
class MetricsLog;
class PromptSource;
class RolloutLog;
class RolloutSide;
class SftData;
class Trainer;
class Transformer;
class WeightSync;
struct Prompt;
struct RolloutBatch;
struct Sample;

class Driver {
 public:
  explicit Driver(RunContext& ctx);
  ~Driver();
  // Runs every step (or until eval.stop_at_pass1 is reached); returns the steps done.
  int64_t run();

 private:
  struct Phase {
    const char* name;
    bool built;
    void (Driver::*body)(int64_t step);
  };
  void eval(int64_t step);
  void rollout(int64_t step);
  void reward(int64_t step);
  void buffer(int64_t step);
  void train(int64_t step);
  void record(int64_t step);
  void weight_sync(int64_t step);
  void metrics(int64_t step);
  void checkpoint(int64_t step);

  // Rounds of draw / generate / score / filter until the batch of step `step` is full
  // (rollout ranks; seeds and Sample::step follow `step`; the router keeps the samples).
  void generate_batch(int64_t step, RolloutBatch& out);
  void postprocess_batch_rewards(RolloutBatch& batch);  // router: group post-processing
  RolloutBatch& batch_to_train();  // sync: this step's; overlapped: the pending one
  // one_step_off: whether this step generates the next step's batch.
  bool generates_next_batch() const;
  // The policy's weights to the engines as `version` (split: bucketed broadcast).
  void push_weights(int64_t version);
  // one_step_off checkpoints: the router writes / reads the pending batch.
  void save_pending_batch(const std::string& dir);
  void load_pending_batch(const std::string& dir);

  void set_up_model_and_trainer();
  void set_up_rollout();
  void check_debug_modes() const;
  // Rank 0 picks the checkpoint to resume from (checkpoint.resume), checks it fits,
  // and on a fresh start moves the earlier run's files aside; sets resume_from_.
  void choose_resume();
  // Loads resume_from_ (if any) and opens or creates rollouts.h5 / metrics.h5.
  void resume_and_open_files();
  void write_checkpoint(int64_t next_step);
  // Whether this rank takes part in writing trainer_state.h5 (Trainer::save).
  bool writes_trainer_state() const;
  // debug.train_only: this trainer's share of the recorded samples of `step`.
  std::vector<Sample> recorded_batch(int64_t step);
  void run_eval(int64_t row);
  // A write to metrics.h5 / metrics.csv; a failure on any rank stops every rank.
  void log_metrics(const std::function<void()>& write);
  // <run dir>/COMPLETE (rank 0 writes it; every rank learns whether that worked).
  void mark_run_complete(int64_t steps);
  // Sends `values` from world rank `root` to every rank (merged into step_metrics_).
  void share_metrics(int root, std::map<std::string, double> values);

  RunContext& ctx_;
  bool rl_ = false;
  bool overlapped_ = false;  // train.async = "one_step_off" or "full": rollout ‖ train
  bool full_async_ = false;  // train.async = "full"
  std::vector<Phase> phases_;
  int router_world_rank_ = 0;            // rollout rank 0 (RL) or trainer rank 0 (SFT eval)
  std::vector<int> trainer_world_ranks_;

  std::unique_ptr<ExpertGroups> expert_groups_;  // trainer ranks, parallel.expert_parallel > 1 (outlives the models)
  std::unique_ptr<Transformer> policy_;        // trainer ranks (an expert shard with expert parallelism)
  std::unique_ptr<Transformer> reference_;     // trainer ranks, with the KL loss
  // split rollout ranks; colocate: a bf16 rollout or expert parallelism (else policy_); SFT eval with expert parallelism
  std::unique_ptr<Transformer> engine_model_;
  std::unique_ptr<Transformer> whole_policy_;  // split, expert parallelism: trainer rank 0's gathered policy to push
  at::ScalarType engine_weight_dtype_ = at::kFloat;  // rollout.precision's weight dtype
  std::unique_ptr<Comm> trainer_comm_;         // trainer ranks
  std::unique_ptr<Comm> sync_comm_;            // split: the weight-broadcast path
  std::unique_ptr<Trainer> trainer_;           // trainer ranks
  std::unique_ptr<WeightSync> weight_sync_;    // sync members
  std::unique_ptr<RolloutSide> rollout_side_;  // ranks that generate (RL rollout ranks; SFT eval: trainers)
  std::shared_ptr<const Tokenizer> tokenizer_;  // every rank: the run's vocabulary
  std::unique_ptr<SftData> sft_data_;          // trainer ranks, sft mode
  std::unique_ptr<PromptSource> prompt_source_;  // every rank, rl mode
  std::vector<Prompt> eval_prompts_;           // every rank, when eval.path is set

  std::unique_ptr<RolloutLog> rollouts_;
  std::unique_ptr<MetricsLog> metrics_;

  // The step in flight.
  struct StepState;
  std::unique_ptr<StepState> step_;
  std::unique_ptr<RolloutBatch> pending_;        // overlapped: the batch the next step trains (router's samples)
  std::unique_ptr<AsyncGenerator> async_;        // full: rollout ranks' continuous generator
  bool trainers_done_posted_ = false;            // full: this rollout rank entered the trainers' Ibarrier
  bool pending_ready_ = false;                   // every rank: pending_ holds that batch
  std::map<std::string, double> step_metrics_;   // the phases' metrics (world rank 0's count)
  std::map<std::string, double> phase_times_;    // "time/<phase>_s" of this rank
  Stopwatch step_clock_;
  double generation_s_ = 0;                      // rollout ranks: this step's generation (any phase)
  bool stop_ = false;                            // eval.stop_at_pass1 reached
  bool said_short_batch_ = false;                // router: the short-batch warning is given once a job
  int64_t n_short_batches_ = 0;                  // steps of this job that trained a short batch
  bool halt_ = false;                            // stop signal or run.job_steps: checkpoint and exit 0
  int64_t start_step_ = 0;                       // 0, or the step a checkpoint resumes at
  std::string ckpt_root_;                        // checkpoint.dir or <run dir>/ckpt
  std::string resume_from_;                      // the checkpoint this job continues, or "" (fresh)
  std::unique_ptr<RolloutLog> recorded_;         // debug.train_only: debug.load_rollouts (trainer ranks)
};

}  // namespace slimpi
