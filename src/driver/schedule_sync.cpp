// train.async = "off": one step generates its batch, trains on it, records it, and
// gives the engines the new weights — nothing crosses a step boundary. Also the
// schedule of train.mode = "sft" (eval, train, record) and of slime's debug modes
// (debug.rollout_only: no train or weight_sync; debug.train_only: no rollout or reward,
// buffer hands out the recorded samples).
#include <slimpi/deck.h>

#include "driver/run_components.h"
#include "driver/step_phases.h"
#include "driver/step_schedule.h"
#include "parallel/mpi_bytes.h"

namespace slimpi {
namespace {

class SyncSchedule : public StepSchedule {
 public:
  explicit SyncSchedule(StepPhases& phases) : p_(phases) {}

  std::vector<Phase> phases() override {
    const Deck& deck = p_.ctx().deck;
    const bool rl = p_.parts().rl, eval_on = !p_.parts().eval_prompts.empty();
    const bool rollout_only = deck.get_bool("debug.rollout_only"), train_only = deck.get_bool("debug.train_only");
    return {{"eval", eval_on, [this](int64_t s) { p_.eval(s); }},
            {"rollout", rl && !train_only, [this](int64_t s) { rollout(s); }},
            {"reward", rl && !train_only, [this](int64_t) { p_.postprocess_group_rewards(p_.step().generated); }},
            {"buffer", rl, [this](int64_t s) { p_.hand_out(s, p_.step().generated); }},
            {"train", !rollout_only, [this](int64_t s) { p_.train(s); }},
            {"record", true, [this](int64_t) { record(); }},
            {"weight_sync", rl && !rollout_only, [this](int64_t s) { p_.push_weights(s + 1); }}};
  }

 private:
  void rollout(int64_t step) {
    if (p_.parts().rollout_side) p_.generate_batch(step, p_.step().generated);
  }
  void record() {
    static const std::string waiting = "[record] rollout ranks waiting for the trainers";
    // The side that finishes first waits asleep, not spinning inside the HDF5
    // collectives on cores the other side needs.
    if (p_.parts().rl) idle_barrier(p_.ctx().world->world(), waiting);
    p_.append_rollouts(p_.step().generated.unused);
  }

  StepPhases& p_;
};

}  // namespace

std::unique_ptr<StepSchedule> make_sync_schedule(StepPhases& phases) { return std::make_unique<SyncSchedule>(phases); }

}  // namespace slimpi
