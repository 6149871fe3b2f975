// Driver: slime's debug modes (see driver.h).
//   debug.rollout_only: rollouts and rewards are produced and logged, nothing trains
//     (the train and weight_sync phases are off; the engines keep their weights).
//   debug.train_only: no generation; training step s replays the samples of step s in
//     debug.load_rollouts (a rollouts.h5), split over the trainers exactly as the
//     router split them (trainer i of T: rows [i·N/T, (i+1)·N/T) of the step), with
//     the recorded rewards, rollout log-probs and sampling supports; the trainers
//     recompute old/reference log-probs, KL and advantages. With the same deck and
//     trainer count it reproduces the recorded run's train/* metrics exactly, and its
//     rollouts.h5 holds the trained rows again with what this replay computed.
#include <slimpi/error.h>

#include <cmath>
#include <filesystem>

#include "driver/driver.h"
#include "io/rollout_log.h"
#include "parallel/mpi_bytes.h"
#include "train/trainer.h"

namespace slimpi {

void Driver::check_debug_modes() const {
  const Deck& deck = ctx_.deck;
  const bool rollout_only = deck.get_bool("debug.rollout_only"), train_only = deck.get_bool("debug.train_only");
  if ((rollout_only || train_only) && !rl_)
    SLIMPI_FAIL_ALL("debug.{} ({}) needs train.mode = \"rl\" ({})", rollout_only ? "rollout_only" : "train_only",
                    deck.source(rollout_only ? "debug.rollout_only" : "debug.train_only"), deck.source("train.mode"));
  if (rollout_only && train_only)
    SLIMPI_FAIL_ALL("debug.rollout_only ({}) and debug.train_only ({}) exclude each other",
                    deck.source("debug.rollout_only"), deck.source("debug.train_only"));
  if (train_only && deck.get_string("debug.load_rollouts").empty())
    SLIMPI_FAIL_ALL("debug.train_only ({}) needs debug.load_rollouts: the rollouts.h5 to replay",
                    deck.source("debug.train_only"));
  if (train_only) {
    namespace fs = std::filesystem;
    const std::string& load = deck.get_string("debug.load_rollouts");
    if (fs::weakly_canonical(load) == fs::weakly_canonical(ctx_.run_dir + "/rollouts.h5"))
      SLIMPI_FAIL_ALL("debug.load_rollouts = \"{}\" ({}) is this run's own rollouts.h5, which the run rewrites; "
                      "replay into another run.dir",
                      load, deck.source("debug.load_rollouts"));
  }
  if (!train_only && !deck.get_string("debug.load_rollouts").empty())
    SLIMPI_FAIL_ALL("debug.load_rollouts ({}) is only read with debug.train_only = true",
                    deck.source("debug.load_rollouts"));
}

std::vector<Sample> Driver::recorded_batch(int64_t step) {
  std::vector<Sample> batch;
  const std::string& path = ctx_.deck.get_string("debug.load_rollouts");
  run_on_all_and_agree(ctx_.world->world(), "debug.train_only: " + path, [&] {
    if (!trainer_) return;
    if (!recorded_) recorded_ = std::make_unique<RolloutLog>(RolloutLog::open(path, MPI_COMM_NULL, false));
    const std::vector<Sample> rows = recorded_->read_trained(step);
    SLIMPI_CHECK(!rows.empty(), "{} has no samples of step {}", path, step);
    const size_t T = trainer_world_ranks_.size(), N = rows.size();
    const size_t me = static_cast<size_t>(rank_in(ctx_.world->trainer()));
    for (size_t i = me * N / T; i < (me + 1) * N / T; ++i) {
      // What the router sent: the rollout fields and the post-processed reward; the
      // trainer recomputes everything else as the recorded run did.
      Sample s = rows[i];
      SLIMPI_CHECK(std::isfinite(s.reward), "{}: step {} sample (group {}, index {}) has reward {}", path, step,
                   s.group_index, s.index, s.reward);
      for (auto* field : {&s.old_log_probs, &s.ref_log_probs, &s.kl, &s.raw_advantages, &s.advantages})
        field->clear();
      batch.push_back(std::move(s));
    }
  });
  return batch;
}

}  // namespace slimpi
