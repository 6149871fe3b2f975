// train.async = "full" (split placement; driver/async_generator.h): the step table of
// one_step_off,
//   weight_sync  eval  buffer  rollout ‖ reward ‖ train  record
// but the rollout ranks never finish a batch and stop: in `rollout` they generate until
// the trainers, done training, enter an MPI_Ibarrier (record); the engines pause at
// their next iteration with sequences in flight; `weight_sync` hands them the new
// weights (rollout.partial decides what the sequences in flight do); `buffer` takes the
// next batch from the queue of finished groups, generating first if it is short.
// Not deterministic (how far generation gets during training is timing); a checkpoint
// holds the queue and every unfinished sequence, so that no sample is lost or trained
// twice across a restart.
#include <slimpi/deck.h>

#include <optional>

#include "buffer/rollout_batch.h"
#include "driver/async_generator.h"
#include "driver/run_components.h"
#include "driver/step_phases.h"
#include "driver/step_schedule.h"
#include "parallel/mpi_bytes.h"
#include "parallel/watchdog.h"
#include "rollout/rollout_side.h"

namespace slimpi {
namespace {

class FullAsyncSchedule : public StepSchedule {
 public:
  explicit FullAsyncSchedule(StepPhases& phases) : p_(phases) {
    RunComponents& parts = p_.parts();
    if (parts.rollout_side)
      async_ = std::make_unique<AsyncGenerator>(p_.ctx().deck, *parts.rollout_side, *parts.prompt_source,
                                                *parts.tokenizer, uint64_t(p_.ctx().deck.get_int("run.seed")));
  }

  std::vector<Phase> phases() override {
    const bool eval_on = !p_.parts().eval_prompts.empty();
    return {{"weight_sync", true, [this](int64_t s) { if (s > 0) p_.push_weights(s, async_.get()); }},
            {"eval", eval_on, [this](int64_t s) { p_.eval(s); }},
            {"buffer", true, [this](int64_t s) { buffer(s); }},
            {"rollout", true, [this](int64_t s) { rollout(s); }},
            {"reward", true, [this](int64_t) { p_.postprocess_group_rewards(p_.step().generated); }},
            {"train", true, [this](int64_t s) { p_.train(s); }},
            {"record", true, [this](int64_t) { record(); }}};
  }

  // The queue and every unfinished sequence (the snapshot is collective over the
  // rollout ranks, so it is taken before any rank can fail alone).
  int64_t save_in_flight(const std::string& dir, const std::string& context) override {
    MPI_Comm world = p_.ctx().world->world();
    int64_t pending_groups = 0;
    std::optional<StreamState> state;
    if (async_) state = async_->snapshot();
    run_on_all_and_agree(world, context, [&] {
      if (state) pending_groups = async_->save(dir, std::move(*state));
    });
    static const std::string pending_context = "[checkpoint] the queued and open groups";
    WaitGuard guard({&pending_context, "MPI_Bcast", 1, "i64", p_.parts().router_world_rank});
    MPI_Bcast(&pending_groups, 1, MPI_INT64_T, p_.parts().router_world_rank, world);
    return pending_groups;
  }

  std::vector<std::string> in_flight_files(int64_t) const override { return AsyncGenerator::checkpoint_files(); }

  void load_in_flight(const std::string& dir, int64_t) override {
    if (async_ && p_.parts().rollout_side->is_router()) async_->load(dir);
  }

  void before_final_eval(int64_t steps) override { p_.push_weights(steps, async_.get()); }

 private:
  bool generates_next_batch() const { return !p_.reached_target(); }

  void buffer(int64_t step) {
    // The next rollout_batch_size groups of the queue (generated first if it is short).
    std::map<std::string, double> async_metrics;
    if (async_) {
      async_metrics = async_->take_batch(step, pending_);
      p_.step().generation_s += async_->take_busy_seconds();
    }
    p_.postprocess_group_rewards(pending_);
    p_.hand_out(step, pending_, async_metrics);
  }

  void rollout(int64_t step) {
    // Generate until the trainers are done training (they enter the barrier in record).
    if (!p_.parts().rollout_side || !generates_next_batch()) return;
    MPI_Request trainers_done;
    check_mpi(MPI_Ibarrier(p_.ctx().world->world(), &trainers_done), "MPI_Ibarrier");
    trainers_done_posted_ = true;
    async_->generate_while_training(step + 1, &trainers_done);
    p_.step().generation_s += async_->take_busy_seconds();
  }

  void record() {
    static const std::string waiting_for_training =
        "[record] waiting for the other side (training, or the next batch's rollout)";
    static const std::string waiting_for_pause = "[record] trainers waiting for the engines to pause";
    MPI_Comm world = p_.ctx().world->world();
    // The trainers' barrier is the signal that pauses the generation (rollout ranks
    // entered it in the rollout phase); the second one waits for the pause.
    if (!trainers_done_posted_) idle_barrier(world, waiting_for_training);
    trainers_done_posted_ = false;
    Stopwatch pause_clock;
    idle_barrier(world, waiting_for_pause);
    if (p_.parts().trainer) p_.step().metrics["perf/async_pause_wait_s"] = pause_clock.seconds();
    p_.append_rollouts(pending_.unused);
    pending_ = RolloutBatch();  // the next buffer phase takes a new batch from the queue
    // Every rank follows the rollout ranks' prompt cursor (the checkpoint records it).
    p_.follow_router_cursor("[record] the router's prompt cursor");
  }

  StepPhases& p_;
  std::unique_ptr<AsyncGenerator> async_;  // rollout ranks: the continuous generator
  RolloutBatch pending_;                   // the batch this step trains (router's samples)
  bool trainers_done_posted_ = false;      // this rollout rank entered the trainers' Ibarrier
};

}  // namespace

std::unique_ptr<StepSchedule> make_full_async_schedule(StepPhases& phases) {
  return std::make_unique<FullAsyncSchedule>(phases);
}

}  // namespace slimpi
