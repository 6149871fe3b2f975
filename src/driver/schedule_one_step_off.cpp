// train.async = "one_step_off" (split placement): the rollout ranks generate step k+1's
// batch with the weights of step k while the trainers train on step k's batch, which
// was generated during step k-1 (slime's --async one-step-off; staleness 1, batch 0 is
// generated first with the initial weights):
//   weight_sync  eval  buffer  rollout ‖ reward ‖ train  record
// (weight_sync first: the engines get step k's weights before generating batch k+1;
// rollout and reward run on the rollout ranks while train runs on the trainers; record
// joins them). The schedule is a function of the deck only: seeds follow the batch's
// step, so two runs give the same files whatever the timing. A checkpoint holds the
// generated-but-untrained batch (pending_rollout.h5 + .json) and a resume trains it,
// bit for bit as a straight run.
#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "buffer/rollout_batch.h"
#include "ckpt/checkpoint_dir.h"
#include "driver/run_components.h"
#include "driver/step_phases.h"
#include "driver/step_schedule.h"
#include "io/h5.h"
#include "io/rollout_log.h"
#include "parallel/mpi_bytes.h"
#include "parallel/watchdog.h"

namespace slimpi {
namespace {

class OneStepOffSchedule : public StepSchedule {
 public:
  explicit OneStepOffSchedule(StepPhases& phases) : p_(phases) {}

  std::vector<Phase> phases() override {
    const bool eval_on = !p_.parts().eval_prompts.empty();
    return {{"weight_sync", true, [this](int64_t s) { weight_sync(s); }},
            {"eval", eval_on, [this](int64_t s) { p_.eval(s); }},
            {"buffer", true, [this](int64_t s) { buffer(s); }},
            {"rollout", true, [this](int64_t s) { rollout(s); }},
            {"reward", true, [this](int64_t) { p_.postprocess_group_rewards(p_.step().generated); }},
            {"train", true, [this](int64_t s) { p_.train(s); }},
            {"record", true, [this](int64_t) { record(); }}};
  }

  int64_t save_in_flight(const std::string& dir, const std::string& context) override {
    if (!pending_ready_) return 0;
    MPI_Comm world = p_.ctx().world->world();
    run_on_all_and_agree(world, context, [&] {
      if (p_.is_router()) save_pending_batch(dir);
    });
    int64_t pending_groups = pending_.groups_generated;
    static const std::string pending_context = "[checkpoint] the pending batch's group count";
    WaitGuard guard({&pending_context, "MPI_Bcast", 1, "i64", p_.parts().router_world_rank});
    MPI_Bcast(&pending_groups, 1, MPI_INT64_T, p_.parts().router_world_rank, world);
    return pending_groups;
  }

  std::vector<std::string> in_flight_files(int64_t pending_groups) const override {
    if (pending_groups == 0) return {};
    return {"pending_rollout.h5", "pending_rollout.json"};
  }

  void load_in_flight(const std::string& dir, int64_t pending_groups) override {
    pending_ready_ = pending_groups > 0;
    if (pending_ready_ && p_.is_router()) load_pending_batch(dir);
  }

  void before_final_eval(int64_t steps) override { p_.push_weights(steps); }  // the engines hold step n-1's

 private:
  // The last step too: its checkpoint then holds the next batch, so a run extended by
  // raising run.n_steps continues exactly as a longer straight run (one batch of extra
  // generation per run). Not once eval.stop_at_pass1 ended the run: a job resumed from it
  // under a target it has not reached generates that batch first (not a straight run's).
  bool generates_next_batch() const { return !p_.reached_target(); }

  void weight_sync(int64_t step) {
    // Before generating step k+1's batch, the engines get step k's weights (at step 0
    // they hold them: the seeded init or model.init_from; a resumed job pushes them
    // again, as the straight run does).
    if (step > 0) p_.push_weights(step);
  }

  void buffer(int64_t step) {
    if (!pending_ready_) {
      // The first step of a fresh run (or of a resume from a checkpoint without a
      // pending batch) generates its own batch, with its weights, before anything overlaps.
      if (p_.parts().rollout_side) p_.generate_batch(step, pending_);
      p_.postprocess_group_rewards(pending_);
      pending_ready_ = true;
    }
    p_.hand_out(step, pending_);
  }

  void rollout(int64_t step) {
    // With this step's weights, while the trainers train.
    if (p_.parts().rollout_side && generates_next_batch()) p_.generate_batch(step + 1, p_.step().generated);
  }

  void record() {
    static const std::string waiting = "[record] waiting for the other side (training, or the next batch's rollout)";
    idle_barrier(p_.ctx().world->world(), waiting);
    p_.append_rollouts(pending_.unused);
    pending_ = std::move(p_.step().generated);  // the batch generated this step is the next step's
    pending_ready_ = generates_next_batch();
    // Every rank follows the rollout ranks' prompt cursor (the checkpoint records it).
    p_.follow_router_cursor("[record] the router's prompt cursor");
  }

  // pending_rollout.h5: the pending batch's samples in rollouts.h5's layout (kept ones
  // first, in group order, then the filtered and surplus ones); pending_rollout.json:
  // its counters. Both written by the router, read back by it alone.
  void save_pending_batch(const std::string& dir) {
    const RolloutBatch& b = pending_;
    {
      RolloutLog log = RolloutLog::create(dir + "/pending_rollout.h5", MPI_COMM_NULL, p_.ctx().deck.to_toml());
      log.append(b.kept, b.unused);
      log.flush();
    }
    h5::check_no_failed_close();  // the destructor's close must have landed too
    nlohmann::json engine = nlohmann::json::array();
    EngineStats stats = b.engine_stats;
    EngineStats::zip(stats, stats, [&](auto& x, auto&) { engine.push_back(x); });
    const nlohmann::json j = {{"kept", b.kept.size()},           {"groups_generated", b.groups_generated},
                              {"groups_dropped", b.groups_dropped}, {"rounds", b.rounds},
                              {"score_s", b.score_s},               {"generate_s", b.generate_s},
                              {"tail_s", b.tail_s},                 {"engine_stats", engine}};
    ckpt::write_checkpoint_file(dir + "/pending_rollout.json", j.dump(1) + "\n");
  }

  void load_pending_batch(const std::string& dir) {
    RolloutBatch& b = pending_;
    b = RolloutBatch();
    const nlohmann::json j = nlohmann::json::parse(std::ifstream(dir + "/pending_rollout.json"));
    std::vector<Sample> all = RolloutLog::open(dir + "/pending_rollout.h5", MPI_COMM_NULL, false).read_all();
    const size_t kept = j.at("kept").get<size_t>();
    SLIMPI_CHECK(kept <= all.size(), "{}/pending_rollout.json: {} kept samples, the .h5 has {}", dir, kept, all.size());
    b.kept.assign(std::make_move_iterator(all.begin()), std::make_move_iterator(all.begin() + kept));
    b.unused.assign(std::make_move_iterator(all.begin() + kept), std::make_move_iterator(all.end()));
    b.groups_generated = j.at("groups_generated");
    b.groups_dropped = j.at("groups_dropped");
    b.rounds = j.at("rounds");
    b.score_s = j.at("score_s");
    b.generate_s = j.at("generate_s");
    b.tail_s = j.value("tail_s", -1.0);  // (files written before it: not measured)
    const nlohmann::json& engine = j.at("engine_stats");
    size_t i = 0;
    EngineStats::zip(b.engine_stats, b.engine_stats, [&](auto& x, auto&) {  // counters added later read as 0
      if (i < engine.size()) x = engine.at(i).get<std::remove_reference_t<decltype(x)>>();
      ++i;
    });
  }

  StepPhases& p_;
  RolloutBatch pending_;        // the batch the next step trains (router's samples)
  bool pending_ready_ = false;  // every rank: pending_ holds that batch
};

}  // namespace

std::unique_ptr<StepSchedule> make_one_step_off_schedule(StepPhases& phases) {
  return std::make_unique<OneStepOffSchedule>(phases);
}

}  // namespace slimpi
