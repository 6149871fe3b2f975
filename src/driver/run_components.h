// RunComponents — the per-rank parts of a running job, built once from the checked
// deck (driver/check_run_deck.h): the tokenizer, the data sources, the models, the
// communicators, the trainer, the rollout side and the weight route. Owned by the
// Driver for the whole job; what a rank has no part in stays null (each member says
// who holds it). Built in two stages around the choice of the checkpoint to resume
// (the policy's weights come from it, model.init_from only on a fresh start).
#pragma once

#include <c10/core/ScalarType.h>

#include <memory>
#include <string>
#include <vector>

#include "data/prompt_source.h"
#include "driver/check_run_deck.h"
#include "driver/run_context.h"

namespace slimpi {

class Comm;
class ModelParallel;
class RolloutSide;
class SftData;
class Tokenizer;
class Trainer;
class Transformer;
class WeightRoute;

struct RunComponents {
  RunConfigs configs;
  bool rl = false;                       // train.mode = "rl"
  int router_world_rank = 0;             // rollout rank 0 (RL) or trainer rank 0 (SFT eval)
  std::vector<int> trainer_world_ranks;  // every rank knows them
  int sample_block = 1;  // consecutive trainers that train the same samples: tensor × context × pipeline parallel

  std::shared_ptr<const Tokenizer> tokenizer;  // every rank: the run's vocabulary
  std::vector<Prompt> eval_prompts;            // every rank, when eval.path is set
  std::unique_ptr<SftData> sft_data;           // trainer ranks, sft mode
  std::unique_ptr<PromptSource> prompt_source;  // every rank, rl mode

  std::unique_ptr<ModelParallel> model_parallel;  // trainer ranks: tensor, expert, data groups (outlives the models)
  std::unique_ptr<Transformer> policy;          // trainer ranks (a tensor and/or expert shard under model parallelism)
  std::unique_ptr<Transformer> reference;       // trainer ranks, with the KL loss
  std::unique_ptr<Transformer> teacher;         // on-policy distillation: trainer ranks, or the router (teacher.placement)
  std::unique_ptr<Comm> engine_group_comm;      // split rollout ranks of a tensor-parallel engine (outlives engine_model)
  // split rollout ranks (a shard with rollout.tensor_parallel); colocate: a bf16 rollout or model parallelism
  // (else policy); SFT eval with model parallelism
  std::unique_ptr<Transformer> engine_model;
  bool engine_fp8 = false;                      // RL with rollout.precision = "fp8" (sync/fp8_weights.h)
  std::unique_ptr<Trainer> trainer;             // trainer ranks
  std::unique_ptr<WeightRoute> weight_route;    // every rank: the policy's weights to the engines (sync/weight_route.h)
  std::unique_ptr<RolloutSide> rollout_side;    // ranks that generate (RL rollout ranks; SFT eval: trainers)

  RunComponents();
  ~RunComponents();
  RunComponents(RunComponents&&) noexcept;
  RunComponents& operator=(RunComponents&&) noexcept;
};

// Stage 1, before a checkpoint is chosen: the tokenizer and the evaluation prompts
// (every rank reads the files, so a bad file is an error all ranks raise alike).
RunComponents load_run_inputs(const RunContext& ctx, RunConfigs configs);
// Stage 2: data sources, models (weights from model.init_from unless `resume_from`
// is set), communicators, trainer, rollout side, weight route. Collective.
void build_run_components(const RunContext& ctx, const std::string& resume_from, RunComponents& c);

}  // namespace slimpi
