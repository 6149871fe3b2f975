// check_run_deck — every rule that ties deck keys together (or to the world layout),
// in one place: run by `slimpi run` before it builds anything, and by `slimpi check`
// without a job. Each failure is one collective error naming the keys and where they
// were set (slimpi::Error, SLIMPI_FAIL_ALL).
// It runs the checks of the config readers too (ModelConfig, TrainerConfig,
// RolloutConfig, RewardConfig ::from_deck: their own cross-key rules), then the rules
// of the run as a whole: train.mode and train.async against placement and debug modes,
// the keys only one schedule reads, group baselines, optimizer steps per rollout,
// expert parallelism against the model and the trainer ranks.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "driver/teacher_model.h"
#include "model/model_config.h"
#include "reward/reward.h"
#include "rollout/rollout_config.h"
#include "train/trainer_config.h"

namespace slimpi {

class Deck;
struct WorldLayout;

// The config readers' results, read once: the run's components are built from them.
struct RunConfigs {
  ModelConfig model;
  TrainerConfig trainer;
  RolloutConfig rollout;
  RewardConfig reward;
  std::optional<TeacherSource> teacher;  // on-policy distillation (train.opd_kl_coef > 0)
};

// The run directory of a deck: run.dir, or runs/<run.name>.
std::string run_dir_of(const Deck& deck);

RunConfigs check_run_deck(const Deck& deck, const WorldLayout& layout);

// train.on_policy = "exact": what this version's batch-invariant kernels cover (the CPU;
// trainer_scores_engines, an RL run: trainer and engines in one precision, fp32 or bf16,
// and of one tensor size). A collective error naming the key otherwise. (Also checked by
// `slimpi generate`, whose engines no trainer scores.) The GPU and the ranks' CPU levels
// are checked when the job knows its devices (driver/run_context.cpp).
void check_exact_on_policy(const Deck& deck, bool trainer_scores_engines);

// The layers of each pipeline stage (parallel.pipeline_parallel, parallel.pipeline_layers:
// model/pipeline_shard.h's stage_layer_counts); a collective error naming the keys when
// they do not fit the model.
std::vector<int64_t> pipeline_layer_counts(const Deck& deck, const ModelConfig& model);

}  // namespace slimpi
