#include "driver/check_run_deck.h"

#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "model/pipeline_shard.h"
#include "parallel/world.h"
#include "train/advantages.h"

namespace slimpi {
namespace {

// train.async = "one_step_off" / "full" overlap generation (rollout ranks) with training
// (trainer ranks): RL, split placement, both sides running.
void check_overlap(const Deck& deck, const WorldLayout& layout) {
  const bool rl = deck.get_string("train.mode") == "rl";
  const bool rollout_only = deck.get_bool("debug.rollout_only"), train_only = deck.get_bool("debug.train_only");
  if (deck.get_string("train.async") != "off") {
    const std::string why = fmt::format("train.async = \"{}\" ({}) overlaps generation on the rollout "
                                        "ranks with training on the trainer ranks",
                                        deck.get_string("train.async"), deck.source("train.async"));
    if (!rl) SLIMPI_FAIL_ALL("{}: it needs train.mode = \"rl\" ({})", why, deck.source("train.mode"));
    if (layout.placement != Placement::Split)
      SLIMPI_FAIL_ALL("{}: with parallel.placement = \"colocate\" ({}) the same ranks do both, so nothing "
                      "overlaps; use placement = \"split\"",
                      why, deck.source("parallel.placement"));
    if (rollout_only || train_only)
      SLIMPI_FAIL_ALL("{}: debug.{} ({}) runs one side only; set train.async = \"off\"", why,
                      rollout_only ? "rollout_only" : "train_only",
                      deck.source(rollout_only ? "debug.rollout_only" : "debug.train_only"));
  }
}

// rollout.weight_sync = "delta" and its key.
void check_delta_sync_keys(const Deck& deck) {
  const bool delta = deck.get_string("rollout.weight_sync") == "delta";
  if (!delta && !deck.has_default_value("rollout.delta_anchor_interval"))
    SLIMPI_FAIL_ALL("rollout.delta_anchor_interval ({}) applies to rollout.weight_sync = \"delta\" only; "
                    "rollout.weight_sync is \"{}\" ({})", deck.source("rollout.delta_anchor_interval"),
                    deck.get_string("rollout.weight_sync"), deck.source("rollout.weight_sync"));
}

// rollout.precision = "fp8" (sync/fp8_weights.h): the sync quantises whole tensors
// (128 x 128 blocks of the whole matrix), so a route that moves slices, or a colocated
// engine that refreshes a shard of its own, would quantise other blocks.
void check_fp8_rollout(const Deck& deck, const WorldLayout& layout) {
  if (deck.get_string("rollout.precision") != "fp8" || deck.get_string("train.mode") != "rl") return;
  const std::string why = fmt::format("rollout.precision = \"fp8\" ({}) quantises each whole weight matrix in "
                                      "128 x 128 blocks at every sync", deck.source("rollout.precision"));
  if (layout.placement == Placement::Split && deck.get_string("rollout.weight_sync_route") == "sliced")
    SLIMPI_FAIL_ALL("{}: rollout.weight_sync_route = \"sliced\" ({}) moves slices; use \"broadcast\" or \"auto\" "
                    "(auto takes broadcast for fp8)", why, deck.source("rollout.weight_sync_route"));
  const int64_t tp = deck.get_int("parallel.tensor_parallel"), ep = deck.get_int("parallel.expert_parallel");
  const int64_t pp = deck.get_int("parallel.pipeline_parallel");
  if (layout.placement == Placement::Colocate && (tp > 1 || ep > 1 || pp > 1))
    SLIMPI_FAIL_ALL("{}: colocated engines under model parallelism (parallel.tensor_parallel = {}, {}; "
                    "parallel.expert_parallel = {}, {}; parallel.pipeline_parallel = {}, {}) refresh from shards, "
                    "which is not built for fp8; use parallel.placement = \"split\"", why, tp,
                    deck.source("parallel.tensor_parallel"), ep, deck.source("parallel.expert_parallel"), pp,
                    deck.source("parallel.pipeline_parallel"));
}

// rollout.prefill_ranks (rollout/disaggregated_router.h): both pools on rollout ranks of
// their own, at least one engine in each.
void check_disaggregation(const Deck& deck, const WorldLayout& layout) {
  const int64_t n = deck.get_int("rollout.prefill_ranks");
  if (n == 0) return;
  const std::string why = fmt::format("rollout.prefill_ranks = {} ({}) makes the last {} rollout ranks prefill "
                                      "engines", n, deck.source("rollout.prefill_ranks"), n);
  if (deck.get_string("train.mode") != "rl")
    SLIMPI_FAIL_ALL("{}, but train.mode = \"{}\" ({}) has no rollout ranks: drop the key", why,
                    deck.get_string("train.mode"), deck.source("train.mode"));
  if (layout.placement != Placement::Split)
    SLIMPI_FAIL_ALL("{}, which needs rollout ranks of their own: parallel.placement = \"colocate\" ({}) gives every "
                    "rank both roles; use parallel.placement = \"split\"", why, deck.source("parallel.placement"));
  if (deck.get_string("train.async") == "full")
    SLIMPI_FAIL_ALL("{}; with train.async = \"full\" ({}) work streams across weight updates to engines that do "
                    "both: not implemented", why, deck.source("train.async"));
  if (layout.engine_size > 1) return;  // tensor-parallel engines: refused with the [rollout] keys
  const int engines = layout.n_rollout;
  if (n >= engines)
    SLIMPI_FAIL_ALL("{}, and leaves no decode engine: the job has {} rollout ranks (parallel.rollout_ranks, {}; "
                    "parallel.trainer_ranks, {}); use fewer prefill ranks or more rollout ranks", why, engines,
                    deck.source("parallel.rollout_ranks"), deck.source("parallel.trainer_ranks"));
}

// Keys only train.async = "full" reads, and the rules among them.
void check_full_async_keys(const Deck& deck) {
  const bool full = deck.get_string("train.async") == "full";
  for (const char* key : {"rollout.queue_batches", "rollout.max_staleness", "rollout.stale_policy",
                          "rollout.partial", "rollout.mask_offpolicy_in_partial"})
    if (!full && !deck.has_default_value(key))
      SLIMPI_FAIL_ALL("{} ({}) applies to train.async = \"full\" only; train.async is \"{}\" ({})", key,
                      deck.source(key), deck.get_string("train.async"), deck.source("train.async"));
  if (full && deck.get_string("rollout.stale_policy") == "regenerate" && deck.get_int("rollout.max_staleness") < 0)
    SLIMPI_FAIL_ALL("rollout.stale_policy = \"regenerate\" ({}) needs a staleness bound: rollout.max_staleness is -1 "
                    "(none; {})",
                    deck.source("rollout.stale_policy"), deck.source("rollout.max_staleness"));
  if (full && deck.get_bool("rollout.mask_offpolicy_in_partial") && deck.get_string("rollout.partial") == "discard")
    SLIMPI_FAIL_ALL("rollout.mask_offpolicy_in_partial ({}) has nothing to mask with rollout.partial = \"discard\" ({}): "
                    "a discarded response starts again, so every sample's tokens are of one weight version",
                    deck.source("rollout.mask_offpolicy_in_partial"), deck.source("rollout.partial"));
}

// Multi-turn environments (rollout/episode_runner.h): the episode's reward is the
// environment's, and episodes finish within the step that generates them.
void check_environment(const Deck& deck) {
  const std::string& env = deck.get_string("rollout.environment");
  const std::string& style = deck.get_string("reward.style");
  if (env != "none" && style != "environment")
    SLIMPI_FAIL_ALL("rollout.environment = \"{}\" ({}) gives every episode its reward; set reward.style = "
                    "\"environment\" (reward.style is \"{}\", {})", env, deck.source("rollout.environment"), style,
                    deck.source("reward.style"));
  if (env == "none" && style == "environment")
    SLIMPI_FAIL_ALL("reward.style = \"environment\" ({}) is the reward of a multi-turn episode, but "
                    "rollout.environment = \"none\" ({}): choose an environment or another reward style",
                    deck.source("reward.style"), deck.source("rollout.environment"));
  if (env != "none" && deck.get_string("train.async") == "full" && deck.get_string("rollout.partial") != "continue")
    SLIMPI_FAIL_ALL("rollout.environment = \"{}\" ({}) with rollout.partial = \"{}\" ({}): an episode's environment "
                    "state lives on the engine that runs it, so episodes in flight at a weight update continue there; "
                    "use rollout.partial = \"continue\"", env, deck.source("rollout.environment"),
                    deck.get_string("rollout.partial"), deck.source("rollout.partial"));
  if (env != "command")
    for (const char* key : {"rollout.env_command", "rollout.env_processes", "rollout.env_max_reply_bytes",
                            "rollout.env_max_restarts"})
      if (!deck.has_default_value(key))
        SLIMPI_FAIL_ALL("{} ({}) applies to rollout.environment = \"command\" only; rollout.environment is \"{}\" ({})",
                        key, deck.source(key), env, deck.source("rollout.environment"));
  // The keys of processes slimpi starts: an environment's or an agent's.
  if (env != "command" && env != "agent")
    for (const char* key : {"rollout.env_max_stderr_bytes", "rollout.env_cpu_limit_s", "rollout.env_memory_limit_mb"})
      if (!deck.has_default_value(key))
        SLIMPI_FAIL_ALL("{} ({}) applies to rollout.environment = \"command\" or \"agent\"; rollout.environment is "
                        "\"{}\" ({})", key, deck.source(key), env, deck.source("rollout.environment"));
  // Under full async the stream's episodes and an evaluation's each have an endpoint on the
  // rank: two servers cannot share one fixed port.
  if (env == "agent" && deck.get_int("rollout.agent_port") != 0 && deck.get_string("train.async") == "full" &&
      !deck.get_string("eval.path").empty())
    SLIMPI_FAIL_ALL("rollout.agent_port = {} ({}) with train.async = \"full\" ({}) and an evaluation (eval.path, {}): "
                    "the stream's agents and the evaluation's are served by two endpoints on each rollout rank, which "
                    "cannot share one port; leave rollout.agent_port at 0 (a port the system picks)",
                    deck.get_int("rollout.agent_port"), deck.source("rollout.agent_port"), deck.source("train.async"),
                    deck.source("eval.path"));
  if (env != "agent")
    for (const char* key : {"rollout.agent_command", "rollout.agent_host", "rollout.agent_port",
                            "rollout.agent_max_sessions", "rollout.agent_max_session_requests", "rollout.agent_model",
                            "rollout.agent_max_request_bytes"})
      if (!deck.has_default_value(key))
        SLIMPI_FAIL_ALL("{} ({}) applies to rollout.environment = \"agent\" only; rollout.environment is \"{}\" ({})",
                        key, deck.source(key), env, deck.source("rollout.environment"));
}

void check_rl_batch(const Deck& deck) {
  const int64_t per_step = deck.get_int("rollout.rollout_batch_size") * deck.get_int("rollout.n_samples_per_prompt");
  if (deck.get_int("train.num_steps_per_rollout") > per_step)
    SLIMPI_FAIL_ALL("train.num_steps_per_rollout = {} ({}) exceeds the {} samples of a step "
                    "(rollout.rollout_batch_size x rollout.n_samples_per_prompt): an optimizer step would get none",
                    deck.get_int("train.num_steps_per_rollout"), deck.source("train.num_steps_per_rollout"), per_step);
  // the estimator's own rules (train/estimators/)
  check_estimator_deck(advantage_estimators().get(deck.get_string("train.advantage_estimator")), deck);
}

// slime's debug modes (driver/replay_source.h).
void check_debug_modes(const Deck& deck) {
  const bool rl = deck.get_string("train.mode") == "rl";
  const bool rollout_only = deck.get_bool("debug.rollout_only"), train_only = deck.get_bool("debug.train_only");
  if ((rollout_only || train_only) && !rl)
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
    if (fs::weakly_canonical(load) == fs::weakly_canonical(run_dir_of(deck) + "/rollouts.h5"))
      SLIMPI_FAIL_ALL("debug.load_rollouts = \"{}\" ({}) is this run's own rollouts.h5, which the run rewrites; "
                      "replay into another run.dir",
                      load, deck.source("debug.load_rollouts"));
  }
  if (!train_only && !deck.get_string("debug.load_rollouts").empty())
    SLIMPI_FAIL_ALL("debug.load_rollouts ({}) is only read with debug.train_only = true",
                    deck.source("debug.load_rollouts"));
}

// Expert parallelism: trainer ranks hold one block of the experts (train/expert_parallel.h).
void check_expert_parallel(const Deck& deck, const ModelConfig& model, const WorldLayout& layout) {
  const int64_t ep = deck.get_int("parallel.expert_parallel");
  if (ep <= 1) return;
  const std::string what = fmt::format("parallel.expert_parallel = {} ({}) shards the experts over groups of {} "
                                       "trainer ranks", ep, deck.source("parallel.expert_parallel"), ep);
  if (model.n_experts == 0)
    SLIMPI_FAIL_ALL("{}, but the model has none: model.n_experts = 0 ({})", what, deck.source("model.n_experts"));
  if (model.n_experts % ep != 0)
    SLIMPI_FAIL_ALL("{}: it must divide model.n_experts = {} ({})", what, model.n_experts,
                    deck.source("model.n_experts"));
  const int64_t tp = deck.get_int("parallel.tensor_parallel");
  if (tp == 1 && layout.n_trainer % ep != 0)
    SLIMPI_FAIL_ALL("{}: it must divide the number of trainer ranks, {} (parallel.trainer_ranks, {}; "
                    "parallel.placement, {})",
                    what, layout.n_trainer, deck.source("parallel.trainer_ranks"), deck.source("parallel.placement"));
  const int64_t pp = deck.get_int("parallel.pipeline_parallel"), block = tp * std::max<int64_t>(pp, 1);
  if (block > 1 && layout.n_trainer % block == 0 && (layout.n_trainer / block) % ep != 0)
    SLIMPI_FAIL_ALL("{}: it must divide the number of data-{}parallel trainer ranks of a tensor rank{}, {} ({} trainer "
                    "ranks / {}{} = {}; parallel.trainer_ranks, {}; parallel.placement, {})",
                    what, deck.get_int("parallel.context_parallel") > 1 ? "and context-" : "",
                    pp > 1 ? " and pipeline stage" : "", layout.n_trainer / block, layout.n_trainer,
                    tp > 1 ? "parallel.tensor_parallel" : "", pp > 1 ? (tp > 1 ? " × parallel.pipeline_parallel" : "parallel.pipeline_parallel") : "",
                    block, deck.source("parallel.trainer_ranks"), deck.source("parallel.placement"));
}

// A model that splits over groups of n ranks (model/tensor_shard.h): heads, key/value
// heads and MLP columns divisible by n. `what` says which layout asks; `key` sets n.
void check_splits_over(const Deck& deck, const ModelConfig& model, const std::string& what, int64_t n,
                       const char* key) {
  auto divisible = [&](const char* field, int64_t value, const std::string& part) {
    if (value % n != 0)
      SLIMPI_FAIL_ALL("{}: {} = {} ({}) is not divisible by {} ({} split over the group)", what, field, value,
                      deck.source(field), n, part);
  };
  if (model.is_hybrid())
    divisible("model.linear_num_key_heads", model.linear_num_key_heads,
              "the Gated DeltaNet layers' key heads are");
  divisible("model.n_heads", model.n_heads, "query heads are");
  if (model.n_kv_heads % n != 0 && n % model.n_kv_heads != 0)
    SLIMPI_FAIL_ALL("{}: model.n_kv_heads = {} ({}) neither is divisible by {} nor divides it (key/value heads are "
                    "split over the group, or, when fewer than its {} ranks, each replicated on {} / n_kv_heads of "
                    "them; {} sets the group)", what, model.n_kv_heads, deck.source("model.n_kv_heads"), n, n, n, key);
  divisible("model.intermediate_size", model.intermediate_size, "the MLP's columns are");
  divisible("model.shared_expert_intermediate_size", model.shared_expert_intermediate_size,
            "the shared expert's columns are");
  if (model.shared_experts_width() % n != 0)
    SLIMPI_FAIL_ALL("{}: the shared experts' width, model.n_shared_experts × model.moe_intermediate_size = {} × {} "
                    "({}; {}), is not divisible by {} (their columns are split over the group as a dense MLP's)",
                    what, model.n_shared_experts, model.moe_intermediate_size, deck.source("model.n_shared_experts"),
                    deck.source("model.moe_intermediate_size"), n);
}

// Tensor parallelism: trainer ranks hold one shard of the dense layers (model/tensor_shard.h).
void check_tensor_parallel(const Deck& deck, const ModelConfig& model, const WorldLayout& layout) {
  const int64_t tp = deck.get_int("parallel.tensor_parallel");
  if (deck.get_bool("parallel.sequence_parallel") && tp <= 1)
    SLIMPI_FAIL_ALL("parallel.sequence_parallel = true ({}) splits the tokens over the tensor-parallel group, but "
                    "parallel.tensor_parallel = {} ({}): set it above 1 or sequence_parallel = false",
                    deck.source("parallel.sequence_parallel"), tp, deck.source("parallel.tensor_parallel"));
  if (tp <= 1) return;
  const std::string what = fmt::format("parallel.tensor_parallel = {} ({}) splits the trainer's layers over groups "
                                       "of {} trainer ranks", tp, deck.source("parallel.tensor_parallel"), tp);
  if (layout.n_trainer % tp != 0)
    SLIMPI_FAIL_ALL("{}: it must divide the number of trainer ranks, {} (parallel.trainer_ranks, {}; "
                    "parallel.placement, {})",
                    what, layout.n_trainer, deck.source("parallel.trainer_ranks"), deck.source("parallel.placement"));
  check_splits_over(deck, model, what, tp, "parallel.tensor_parallel");
}

// Context parallelism (model/context_split.h): tensor × context blocks of trainer ranks,
// each training one data-parallel share.
void check_context_parallel(const Deck& deck, const WorldLayout& layout) {
  const int64_t cp = deck.get_int("parallel.context_parallel");
  if (cp <= 1) return;
  const int64_t tp = deck.get_int("parallel.tensor_parallel");
  const std::string what = fmt::format("parallel.context_parallel = {} ({}) splits every sequence over groups of {} "
                                       "trainer ranks", cp, deck.source("parallel.context_parallel"), cp);
  if (layout.n_trainer % (tp * cp) != 0)
    SLIMPI_FAIL_ALL("{}: parallel.tensor_parallel × parallel.context_parallel = {} × {} = {} must divide the number "
                    "of trainer ranks, {} (parallel.trainer_ranks, {}; parallel.placement, {})", what, tp, cp, tp * cp,
                    layout.n_trainer, deck.source("parallel.trainer_ranks"), deck.source("parallel.placement"));
}

// Pipeline parallelism (model/pipeline_shard.h): tensor × context × pipeline blocks of
// trainer ranks; engines that take a whole model (split placement: the broadcast route;
// colocated: one-rank engines).
void check_pipeline_parallel(const Deck& deck, const ModelConfig& model, const WorldLayout& layout) {
  const int64_t pp = deck.get_int("parallel.pipeline_parallel");
  if (pp <= 1) {
    if (!deck.get_string("parallel.pipeline_layers").empty())
      SLIMPI_FAIL_ALL("parallel.pipeline_layers = \"{}\" ({}) sets the layers of pipeline stages, but "
                      "parallel.pipeline_parallel = {} ({}): drop it or set pipeline_parallel above 1",
                      deck.get_string("parallel.pipeline_layers"), deck.source("parallel.pipeline_layers"), pp,
                      deck.source("parallel.pipeline_parallel"));
    return;
  }
  const int64_t tp = deck.get_int("parallel.tensor_parallel"), cp = deck.get_int("parallel.context_parallel");
  const std::string what = fmt::format("parallel.pipeline_parallel = {} ({}) splits the trainer's layers into {} "
                                       "stages", pp, deck.source("parallel.pipeline_parallel"), pp);
  if (layout.n_trainer % (tp * cp * pp) != 0)
    SLIMPI_FAIL_ALL("{}: parallel.tensor_parallel × parallel.context_parallel × parallel.pipeline_parallel = {} × {} "
                    "× {} = {} must divide the number of trainer ranks, {} (parallel.trainer_ranks, {}; "
                    "parallel.placement, {})", what, tp, cp, pp, tp * cp * pp, layout.n_trainer,
                    deck.source("parallel.trainer_ranks"), deck.source("parallel.placement"));
  pipeline_layer_counts(deck, model);
  auto refuse = [&](const std::string& why) { SLIMPI_FAIL_ALL("{}: {}", what, why); };
  if (deck.get_string("train.mode") == "rl" && layout.placement == Placement::Colocate &&
      deck.get_int("rollout.tensor_parallel") > 1)
    refuse(fmt::format("colocated tensor-parallel engines run the policy's own shards, which a stage holds only some "
                       "layers of; set rollout.tensor_parallel = 1 ({}) or parallel.placement = \"split\"",
                       deck.source("rollout.tensor_parallel")));
  if (deck.get_string("train.mode") == "rl" && layout.placement == Placement::Split &&
      deck.get_string("rollout.weight_sync_route") == "sliced")
    refuse(fmt::format("the sliced weight sync sends each engine rank its shard from the trainer ranks holding it, "
                       "which is not built for stages; rollout.weight_sync_route = \"sliced\" ({}): use "
                       "\"broadcast\" or \"auto\"", deck.source("rollout.weight_sync_route")));
}

// Tensor-parallel engines: each engine's model splits as a tensor-parallel trainer's does.
void check_engine_tensor_parallel(const Deck& deck, const ModelConfig& model, bool rl) {
  const int64_t e = deck.get_int("rollout.tensor_parallel");
  if (e <= 1) return;
  const std::string what = fmt::format("rollout.tensor_parallel = {} ({}) splits each engine's layers over {} rollout "
                                       "ranks", e, deck.source("rollout.tensor_parallel"), e);
  if (!rl)
    SLIMPI_FAIL_ALL("{}, but train.mode = \"{}\" ({}) has no rollout ranks: drop the key", what,
                    deck.get_string("train.mode"), deck.source("train.mode"));
  check_splits_over(deck, model, what, e, "rollout.tensor_parallel");
}

}  // namespace

std::vector<int64_t> pipeline_layer_counts(const Deck& deck, const ModelConfig& model) {
  const int64_t pp = deck.get_int("parallel.pipeline_parallel");
  const std::string& text = deck.get_string("parallel.pipeline_layers");
  std::vector<int64_t> counts;
  if (!text.empty()) {
    if (text.back() == ',')
      SLIMPI_FAIL_ALL("parallel.pipeline_layers = \"{}\" ({}) ends with a comma: one layer count a stage", text,
                      deck.source("parallel.pipeline_layers"));
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');) {
      size_t used = 0;
      int64_t n = -1;
      bool parsed = true;
      try {
        n = std::stoll(item, &used);
      } catch (const std::exception&) {
        parsed = false;
      }
      while (parsed && used < item.size() && item[used] == ' ') ++used;
      if (!parsed || used != item.size())
        SLIMPI_FAIL_ALL("parallel.pipeline_layers = \"{}\" ({}): \"{}\" is not a layer count (comma-separated "
                        "integers, one a stage)", text, deck.source("parallel.pipeline_layers"), item);
      counts.push_back(n);
    }
  }
  try {
    return stage_layer_counts(model.n_layers, int(pp), counts);
  } catch (const Error& e) {
    SLIMPI_FAIL_ALL("parallel.pipeline_parallel = {} ({}), parallel.pipeline_layers = \"{}\" ({}), model.n_layers = "
                    "{} ({}): {}", pp, deck.source("parallel.pipeline_parallel"), text,
                    deck.source("parallel.pipeline_layers"), model.n_layers, deck.source("model.n_layers"), e.what());
  }
}

void check_exact_on_policy(const Deck& deck, bool trainer_scores_engines) {
  if (deck.get_string("train.on_policy") != "exact") return;
  const std::string why = fmt::format("train.on_policy = \"exact\" ({})", deck.source("train.on_policy"));
  // The trainer's forward and the engine's compute alike in one precision: fp32, or bf16
  // (the trainer's fp32 masters used as their bf16 roundings, which is what a bf16 engine
  // holds). FP8 engines hold other weights than the trainer uses.
  const std::string& train_precision = deck.get_string("train.precision");
  const std::string& rollout_precision = deck.get_string("rollout.precision");
  if (trainer_scores_engines && rollout_precision == "fp8")
    SLIMPI_FAIL_ALL("{} needs the engines to hold the weights the trainer uses; rollout.precision = \"fp8\" ({}) "
                    "quantises them in blocks: set it to \"{}\" (train.precision, {})", why,
                    deck.source("rollout.precision"), train_precision, deck.source("train.precision"));
  if (trainer_scores_engines && train_precision != rollout_precision)
    SLIMPI_FAIL_ALL("{} needs the trainer and the engines to compute in one precision; train.precision = \"{}\" ({}), "
                    "rollout.precision = \"{}\" ({}): set both to \"fp32\" or both to \"bf16\"", why,
                    train_precision, deck.source("train.precision"), rollout_precision,
                    deck.source("rollout.precision"));
  // A row-parallel layer's sum is over the group's parts: the same parts only in groups
  // of one size (colocated too: engines of one rank there run a whole copy of the model).
  if (trainer_scores_engines && deck.get_int("parallel.tensor_parallel") != deck.get_int("rollout.tensor_parallel"))
    SLIMPI_FAIL_ALL("{} needs engines of the trainers' tensor size: parallel.tensor_parallel = {} ({}), "
                    "rollout.tensor_parallel = {} ({})", why, deck.get_int("parallel.tensor_parallel"),
                    deck.source("parallel.tensor_parallel"), deck.get_int("rollout.tensor_parallel"),
                    deck.source("rollout.tensor_parallel"));
  if (deck.get_string("run.device") == "cuda")
    SLIMPI_FAIL_ALL("{} runs on the CPU in this version; run.device = \"cuda\" ({})", why, deck.source("run.device"));
}

std::string run_dir_of(const Deck& deck) {
  const std::string& dir = deck.get_string("run.dir");
  return dir.empty() ? "runs/" + deck.get_string("run.name") : dir;
}

RunConfigs check_run_deck(const Deck& deck, const WorldLayout& layout) {
  const bool rl = deck.get_string("train.mode") == "rl";
  check_overlap(deck, layout);
  check_full_async_keys(deck);
  check_delta_sync_keys(deck);
  check_fp8_rollout(deck, layout);
  check_disaggregation(deck, layout);
  if (deck.get_string("data.path").empty())
    SLIMPI_FAIL_ALL("train.mode = \"{}\" ({}) needs a data file: set data.path", deck.get_string("train.mode"),
                    deck.source("train.mode"));
  if (rl) check_rl_batch(deck);
  check_environment(deck);
  check_debug_modes(deck);
  RunConfigs c;
  c.model = ModelConfig::from_deck(deck);
  check_exact_on_policy(deck, rl);
  c.trainer = TrainerConfig::from_deck(deck);
  check_tensor_parallel(deck, c.model, layout);
  check_context_parallel(deck, layout);
  check_pipeline_parallel(deck, c.model, layout);
  check_engine_tensor_parallel(deck, c.model, rl);
  check_expert_parallel(deck, c.model, layout);
  c.rollout = RolloutConfig::from_deck(deck, c.model, /*rollout_weights=*/rl);
  c.rollout.env.run_dir = run_dir_of(deck);
  c.reward = RewardConfig::from_deck(deck);
  if (rl && c.trainer.opd_kl_coef > 0) {
    c.teacher = resolve_teacher(deck, c.model, *c.rollout.tokenizer);
    // A trainer-side teacher runs in the pipeline's stages, its layers split evenly.
    const int64_t pp = deck.get_int("parallel.pipeline_parallel");
    if (pp > 1 && c.trainer.teacher_placement == "trainer" && c.teacher->config.n_layers < pp)
      SLIMPI_FAIL_ALL("parallel.pipeline_parallel = {} ({}) splits the teacher's layers into {} stages too, but it has "
                      "{} (teacher.path = \"{}\", {}): use fewer stages{}", pp,
                      deck.source("parallel.pipeline_parallel"), pp, c.teacher->config.n_layers,
                      deck.get_string("teacher.path"), deck.source("teacher.path"),
                      layout.placement == Placement::Split ? ", or teacher.placement = \"rollout\" (the router scores)"
                                                           : ", or parallel.placement = \"split\" with teacher.placement = "
                                                             "\"rollout\" (the router scores)");
  }
  return c;
}

}  // namespace slimpi
