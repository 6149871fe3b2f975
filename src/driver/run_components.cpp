#include "driver/run_components.h"

#include <ATen/ATen.h>
#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <malloc.h>

#include <filesystem>

#include "core/log.h"
#include "io/tensor_io.h"
#include "model/precision.h"
#include "model/transformer.h"
#include "parallel/comm.h"
#include "rollout/fp8_weights.h"
#include "rollout/rollout_side.h"
#include "rollout/weight_sync.h"
#include "rollout/weight_sync_plan.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "driver/teacher_model.h"
#include "train/critic.h"
#include "train/model_parallel.h"
#include "train/sft_data.h"
#include "train/trainer.h"

namespace slimpi {
namespace {

uint64_t run_seed(const Deck& deck) { return static_cast<uint64_t>(deck.get_int("run.seed")); }

// The longest prompt a response of rollout.max_new_tokens still fits behind.
int64_t max_prompt_tokens(const Deck& deck) {
  return deck.get_int("model.max_seq_len") - deck.get_int("rollout.max_new_tokens");
}

// What train.global_batch_size means for a rollout of `per_step` samples, said once
// when it does not divide them (the step splits its samples evenly over the steps).
void describe_optimizer_steps(const Deck& deck, int64_t per_step) {
  const int64_t gbs = deck.get_int("train.global_batch_size");
  if (deck.get_int("train.num_steps_per_rollout") > 0) {
    if (!deck.has_default_value("train.global_batch_size"))
      log::info("train.global_batch_size = {} ({}) is not used: train.num_steps_per_rollout = {} ({}) sets the "
                "optimizer steps of a rollout",
                gbs, deck.source("train.global_batch_size"), deck.get_int("train.num_steps_per_rollout"),
                deck.source("train.num_steps_per_rollout"));
    return;
  }
  if (per_step % gbs == 0) return;
  const int64_t n_steps = std::max<int64_t>(1, per_step / gbs);
  if (log::is_root())  // a deck fact: said once, not by every rank
    log::warn("train.global_batch_size = {} ({}) does not divide the {} samples of a rollout "
              "(rollout.rollout_batch_size x rollout.n_samples_per_prompt): each rollout takes {} optimizer step{} "
              "(its samples split evenly over them); set train.num_steps_per_rollout to choose",
              gbs, deck.source("train.global_batch_size"), per_step, n_steps, n_steps > 1 ? "s" : "");
}

void load_data_sources(const RunContext& ctx, RunComponents& c) {
  const Deck& deck = ctx.deck;
  if (!c.rl) {
    if (ctx.world->is_trainer())
      c.sft_data = std::make_unique<SftData>(deck.get_string("data.path"), deck.get_string("data.input_key"),
                                             deck.get_string("data.response_key"), c.configs.model.max_seq_len,
                                             run_seed(deck), *c.tokenizer, ChatFormat::from_deck(deck, *c.tokenizer));
    else  // every rank reads the file, so that a bad one is an error all ranks raise alike
      SftData(deck.get_string("data.path"), deck.get_string("data.input_key"), deck.get_string("data.response_key"),
              c.configs.model.max_seq_len, run_seed(deck), *c.tokenizer, ChatFormat::from_deck(deck, *c.tokenizer));
    if (c.sft_data) log::info("SFT data: {} samples from {}", c.sft_data->size(), deck.get_string("data.path"));
    return;
  }
  PromptSourceSpec spec = PromptSourceSpec::from_deck(deck, deck.get_string("data.path"), c.tokenizer);
  spec.metadata_key = deck.get_string("data.metadata_key");
  spec.skip_bad_lines = deck.get_bool("data.skip_bad_lines");
  spec.max_prompt_tokens = max_prompt_tokens(deck);
  c.prompt_source = std::make_unique<PromptSource>(spec, run_seed(deck));
  log::info("prompts: {} from {} ({} bad lines skipped)", c.prompt_source->size(), deck.get_string("data.path"),
            c.prompt_source->n_skipped_lines());
}

// The policy (and reference) on trainer ranks, the engines' model where it is not the
// policy itself. Weights are drawn in fp32 from the run seed whatever their dtype, so
// a bf16 engine model starts as the fp32 policy rounded once. A resumed job takes the
// policy from its checkpoint: model.init_from is read only for a fresh start, and for
// the frozen reference model (which checkpoints do not hold).
void build_models(const RunContext& ctx, const std::string& resume_from, RunComponents& c) {
  const Deck& deck = ctx.deck;
  const ModelConfig& model_cfg = c.configs.model;
  const at::Device device = ctx.device.use_cuda ? at::Device(at::kCUDA, ctx.device.gpu) : at::Device(at::kCPU);
  const std::string& init_from = deck.get_string("model.init_from");
  const int ep = static_cast<int>(deck.get_int("parallel.expert_parallel"));
  const int tp = static_cast<int>(deck.get_int("parallel.tensor_parallel"));
  for (const auto& [key, n] : {std::pair{"parallel.expert_parallel", ep}, std::pair{"parallel.tensor_parallel", tp}})
    if (n > 1 && ctx.device.use_cuda && !ctx.device.use_nccl)
      SLIMPI_FAIL_ALL("{} = {} ({}) shards the model over groups of {} trainer ranks: on GPUs its collectives run "
                      "inside backward, on autograd's own threads, where MPI may not be called; use "
                      "parallel.comm_backend = \"nccl\" or \"auto\" ({})",
                      key, n, deck.source(key), n, deck.source("parallel.comm_backend"));
  const bool sharded = ep > 1 || tp > 1;
  // A resume whose reference weights are gone stops the whole job, not the trainers
  // alone (only they read the file: rollout nodes may not even mount its path).
  int reference_gone = !init_from.empty() && !resume_from.empty() && Trainer::needs_reference(c.configs.trainer) &&
                       ctx.world->is_trainer() && !std::filesystem::exists(init_from);
  MPI_Allreduce(MPI_IN_PLACE, &reference_gone, 1, MPI_INT, MPI_MAX, ctx.world->world());
  if (reference_gone)
    SLIMPI_FAIL_ALL("model.init_from = \"{}\" ({}) is gone: the reference model of the KL terms is those "
                    "weights (a checkpoint holds the policy only); restore the file to resume",
                    init_from, deck.source("model.init_from"));
  auto make_model = [&](bool is_reference, at::ScalarType weights, const ModelParallel* mp = nullptr,
                        const TensorShard& engine_shard = {}) {
    const ExpertShard experts = mp ? mp->expert_shard() : ExpertShard{};
    const TensorShard tensor = mp ? mp->tensor_shard() : engine_shard;
    auto m = std::make_unique<Transformer>(model_cfg, run_seed(deck), device, weights, experts, tensor);
    if (!init_from.empty() && (resume_from.empty() || is_reference)) {
      load_model_weights(m->parameters(), init_from, "model", experts.size > 1, StoredWhole{&model_cfg, tensor});
    }
    return m;
  };
  if (c.configs.trainer.opd_kl_coef > 0 && c.configs.trainer.teacher_placement == "rollout" &&
      ctx.world->rank() == c.router_world_rank)
    c.teacher = load_teacher(*c.configs.teacher, device);  // the router scores every kept sample
  if (ctx.world->is_trainer()) {
    c.model_parallel = std::make_unique<ModelParallel>(ctx.world->trainer(), tp, ep, ctx.device,
                                                       deck.get_bool("parallel.sequence_parallel"),
                                                       kv_head_replicas(model_cfg, tp));
    const ModelParallel& mp = *c.model_parallel;
    c.policy = make_model(false, at::kFloat, &mp);
    if (Trainer::needs_reference(c.configs.trainer)) {
      c.reference = make_model(true, at::kFloat, &mp);
      for (auto& p : c.reference->parameters()) p.tensor.set_requires_grad(false);
    }
    // A resumed PPO run takes its critic from the checkpoint: critic.init_from is read
    // only for a fresh start (it may be gone by now, as model.init_from may).
    std::string& critic_from = c.configs.trainer.critic.init_from;
    if (!resume_from.empty() && !critic_from.empty() && file_holds_critic(resume_from + "/trainer_state.h5")) {
      log::info("critic.init_from = \"{}\" ({}) is not read: the critic resumes from {}", critic_from,
                deck.source("critic.init_from"), resume_from);
      critic_from.clear();
    }
    c.trainer = std::make_unique<Trainer>(c.configs.trainer, *c.policy, &mp.data(), c.reference.get(),
                                          mp.expert_replicas());
    if (c.configs.trainer.opd_kl_coef > 0 && c.configs.trainer.teacher_placement == "trainer") {
      c.teacher = load_teacher(*c.configs.teacher, device);
      c.trainer->set_teacher(c.teacher.get());
    }
    log::info("policy: {} parameters ({} layers, d {}, {} heads / {} kv heads) on {}, from {}", model_cfg.n_params(),
              model_cfg.n_layers, model_cfg.hidden_size, model_cfg.n_heads, model_cfg.n_kv_heads, device.str(),
              init_from.empty() ? "the seeded init" : init_from);
    if (tp > 1)
      log::info("tensor parallelism: {} group{} of {} trainer ranks (data-parallel size {}); this rank is tensor rank "
                "{}: {} of {} query heads, {} of {} MLP columns, vocabulary rows {}..{} of {} padded ({} parameters "
                "here){}", mp.data_size(), mp.data_size() > 1 ? "s" : "", tp, mp.data_size(), mp.tensor_rank(),
                model_cfg.n_heads / tp, model_cfg.n_heads, model_cfg.intermediate_size / tp,
                model_cfg.intermediate_size, c.policy->vocab_begin(),
                c.policy->vocab_begin() + padded_vocab_size(model_cfg.vocab_size, tp) / tp - 1,
                padded_vocab_size(model_cfg.vocab_size, tp), c.policy->n_params(),
                mp.tensor_shard().sequence_parallel ? "; sequence parallel: norms and residuals hold 1/" +
                                                          std::to_string(tp) + " of the tokens" : "");
    if (const int rep = kv_head_replicas(model_cfg, tp); rep > 1)
      log::info("key/value heads replicated: the model's {} key/value heads are fewer than the {} ranks of a tensor "
                "group, so each is held whole by {} consecutive tensor ranks (the ones whose query heads attend with "
                "it), which sum its gradients; this rank holds key/value head {}", model_cfg.n_kv_heads, tp, rep,
                mp.tensor_rank() / rep);
    if (c.configs.trainer.distributed_optimizer)
      log::info("distributed optimizer: the AdamW moments sharded over the {} data-parallel rank{} of each tensor "
                "rank{}", mp.data_size(), mp.data_size() > 1 ? "s" : "",
                ep > 1 ? fmt::format(" (the experts' over their {} replicas)", mp.data_size() / ep) : "");
    if (ep > 1) {
      const ExpertShard shard = mp.expert_shard();
      log::info("expert parallelism: {} group{} of {} data-parallel ranks; this rank holds experts {}..{} of {} ({} "
                "parameters here)", mp.data_size() / ep, mp.data_size() / ep > 1 ? "s" : "",
                ep, shard.first(model_cfg.n_experts),
                shard.first(model_cfg.n_experts) + shard.count(model_cfg.n_experts) - 1, model_cfg.n_experts,
                c.policy->n_params());
    }
  }
  // The engines' model: their own on split rollout ranks; on colocated ranks the
  // policy itself, or a bf16 copy of it when the rollout runs in bf16. With model
  // parallelism a colocated one-rank engine (or the SFT evaluation) runs a whole model
  // of its own, gathered from the groups' shards before each use; a colocated engine
  // of the tensor group's ranks (rollout.tensor_parallel = parallel.tensor_parallel)
  // runs the policy's shards themselves, or its own copy of this rank's shard (bf16,
  // or every expert where expert parallelism holds some of them).
  const at::ScalarType rollout_weights = rollout_weight_dtype(deck.get_string("rollout.precision"));
  c.engine_weight_dtype = rollout_weights;
  c.engine_fp8 = deck.get_string("rollout.precision") == "fp8";
  const WorldLayout& layout = ctx.world->layout();
  const int engine_tp = layout.engine_size;
  if (c.rl && engine_tp > 1)  // a layout fact, said by rank 0
    log::info("tensor-parallel engines: {} engine{} of {} {} (the first of each routes and samples); each "
              "rank holds {} of {} query heads, {} of {} key/value heads{}, {} of {} MLP columns and its heads' KV cache",
              layout.n_rollout / engine_tp, layout.n_rollout / engine_tp > 1 ? "s" : "", engine_tp,
              layout.placement == Placement::Colocate
                  ? (rollout_weights == at::kFloat && ep == 1
                         ? "ranks, each a tensor group of the trainer running the policy's own shards"
                         : "ranks, each a tensor group of the trainer running a copy of its shards refreshed at "
                           "every step")
                  : "rollout ranks",
              model_cfg.n_heads / engine_tp, model_cfg.n_heads, local_kv_heads(model_cfg, engine_tp),
              model_cfg.n_kv_heads, kv_head_replicas(model_cfg, engine_tp) > 1
                  ? fmt::format(" (each replicated on {} ranks)", kv_head_replicas(model_cfg, engine_tp)) : "",
              model_cfg.intermediate_size / engine_tp, model_cfg.intermediate_size);
  if (const int64_t steps = c.configs.rollout.engine.spec_steps; c.rl && steps > 0)  // a deck fact, said by rank 0
    log::info("speculative decoding: chains of {} tokens drafted by the policy's first MTP depth and verified by exact "
              "rejection sampling{}; the draft is the policy's own MTP layers, in its weights (every weight sync "
              "carries it: the draft's version is the policy's)", steps,
              c.configs.rollout.engine.spec_max_running > 0
                  ? fmt::format(", none while more than {} sequences run", c.configs.rollout.engine.spec_max_running)
                  : std::string());
  const bool colocated_tp_engine = c.rl && engine_tp > 1 && layout.placement == Placement::Colocate;
  if (colocated_tp_engine) {
    if (rollout_weights != at::kFloat || ep > 1) {
      TensorShard shard = c.model_parallel->tensor_shard();
      shard.sequence_parallel = false;  // an engine's forward holds every token (no gradients either)
      shard.kv_replicas = nullptr;
      c.engine_model = make_model(false, rollout_weights, nullptr, shard);
    }
  } else if (c.rl && ctx.world->is_rollout() && engine_tp > 1) {  // split placement: one shard of a tensor-parallel engine
    c.engine_group_comm = make_comm(ctx.world->engine_group(), "engine_group", ctx.device);
    const TensorShard shard{c.engine_group_comm->rank(), engine_tp, c.engine_group_comm.get(), false};
    c.engine_model = make_model(false, rollout_weights, nullptr, shard);
  } else if (c.rl && ctx.world->is_rollout() &&
             (!ctx.world->is_trainer() || rollout_weights != at::kFloat || sharded)) {
    c.engine_model = make_model(false, rollout_weights);
  }
  if (!c.rl && sharded && ctx.world->is_trainer() && !deck.get_string("eval.path").empty())
    c.engine_model = make_model(false, at::kFloat);
}

void build_rollout(const RunContext& ctx, RunComponents& c) {
  const Deck& deck = ctx.deck;
  const RolloutConfig& rc = c.configs.rollout;
  if (c.rl && ctx.world->is_rollout()) {
    const Transformer& model = c.engine_model ? *c.engine_model : *c.policy;
    c.rollout_side = std::make_unique<RolloutSide>(rc, model, ctx.world->engines(), run_seed(deck),
                                                   ctx.world->engine_group());
  } else if (!c.rl && !c.eval_prompts.empty() && ctx.world->is_trainer()) {
    c.rollout_side = std::make_unique<RolloutSide>(rc, c.engine_model ? *c.engine_model : *c.policy,
                                                   ctx.world->trainer(), run_seed(deck));
  }
  if (c.rl && ctx.world->layout().placement == Placement::Colocate && deck.get_string("rollout.weight_sync") == "delta")
    log::info("rollout.weight_sync = \"delta\" ({}) has nothing to do: colocated engines take the trainer's weights "
              "in place, with no sync", deck.source("rollout.weight_sync"));
  if (!c.rl || ctx.world->layout().placement != Placement::Split) return;
  const int64_t bucket = deck.get_int("rollout.weight_sync_bucket_mb") << 20;
  const WorldLayout& layout = ctx.world->layout();
  const bool sliced = sliced_weight_sync(deck, layout);
  const DeltaSyncConfig delta{deck.get_string("rollout.weight_sync") == "delta",
                              deck.get_int("rollout.delta_anchor_interval")};
  log::info("weight sync: {} (rollout.weight_sync_route = \"{}\", {})", sliced
            ? fmt::format("sliced: each engine rank receives its shard from the {} trainer rank{} holding one",
                          layout.trainer_tensor * layout.trainer_expert,
                          layout.trainer_tensor * layout.trainer_expert > 1 ? "s" : "")
            : std::string("broadcast: trainer rank 0 sends the whole model to every rollout rank"),
            deck.get_string("rollout.weight_sync_route"), deck.source("rollout.weight_sync_route"));
  if (sliced) {
    if (ctx.world->sliced_sync() == MPI_COMM_NULL) return;
    c.sync_comm = make_comm(ctx.world->sliced_sync(), "sliced_sync", ctx.device);
    const SyncLayout sl{layout.trainer_tensor, layout.trainer_expert, layout.n_rollout / layout.engine_size,
                        layout.engine_size};
    c.sliced_sync = std::make_unique<SlicedWeightSync>(*c.sync_comm, c.configs.model, sl, bucket, delta);
    return;
  }
  if (ctx.world->sync() == MPI_COMM_NULL) return;
  c.sync_comm = make_comm(ctx.world->sync(), "sync", ctx.device);
  c.weight_sync = std::make_unique<WeightSync>(*c.sync_comm, bucket, delta);
  if (c.engine_model && c.engine_model->tensor_shard().size > 1)  // receives whole, keeps its shard
    c.whole_engine_model = std::make_unique<Transformer>(c.configs.model, run_seed(deck), c.engine_model->device(),
                                                         c.engine_model->weight_dtype());
  if (c.engine_fp8 && c.engine_model && !ctx.world->is_trainer())  // receives the fp8 image, keeps it
    c.fp8_image = std::make_unique<WeightImage>(
        fp8_weight_image(c.whole_engine_model ? *c.whole_engine_model : *c.engine_model, /*quantize=*/false));
}

}  // namespace

bool sliced_weight_sync(const Deck& deck, const WorldLayout& layout) {
  const std::string& route = deck.get_string("rollout.weight_sync_route");
  if (route != "auto") return route == "sliced";
  if (deck.get_string("rollout.precision") == "fp8") return false;  // fp8 quantises whole tensors (rollout/fp8_weights.h)
  // One-rank engines take the whole model either way; the broadcast's tree beats the
  // plan's one send per engine there (perf/bench_weight_sync.cpp).
  return layout.engine_size > 1;
}

RunComponents::RunComponents() = default;
RunComponents::~RunComponents() = default;
RunComponents::RunComponents(RunComponents&&) noexcept = default;
RunComponents& RunComponents::operator=(RunComponents&&) noexcept = default;

RunComponents load_run_inputs(const RunContext& ctx, RunConfigs configs) {
  const Deck& deck = ctx.deck;
  RunComponents c;
  c.configs = std::move(configs);
  c.rl = deck.get_string("train.mode") == "rl";
  c.tensor_parallel = static_cast<int>(deck.get_int("parallel.tensor_parallel"));
  const WorldLayout& layout = ctx.world->layout();
  for (int r = 0; r < layout.world_size; ++r)
    if (layout.is_trainer(r)) c.trainer_world_ranks.push_back(r);
  c.router_world_rank = c.rl && layout.placement == Placement::Split ? layout.n_trainer : 0;
  c.tokenizer = c.configs.rollout.tokenizer;
  log::info("tokenizer: {}", c.tokenizer->describe());
  if (const std::string note = describe_chat_template_choice(deck, *c.tokenizer); !note.empty()) log::info("{}", note);
  if (!deck.get_string("eval.path").empty()) {
    PromptSourceSpec spec = PromptSourceSpec::from_deck(deck, deck.get_string("eval.path"), c.tokenizer);
    spec.max_prompt_tokens = max_prompt_tokens(deck);
    c.eval_prompts = PromptSource(spec, run_seed(deck)).records();
  }
  if (c.rl)
    describe_optimizer_steps(deck, deck.get_int("rollout.rollout_batch_size") *
                                       deck.get_int("rollout.n_samples_per_prompt"));
  return c;
}

void build_run_components(const RunContext& ctx, const std::string& resume_from, RunComponents& c) {
  load_data_sources(ctx, c);
  build_models(ctx, resume_from, c);
  // A shard is cut from whole tensors drawn (or read) one at a time: the freed wholes
  // go back to the OS instead of staying in the process (docs/architecture.md, threads
  // and memory).
  malloc_trim(0);
  build_rollout(ctx, c);
  // An fp8 engine's first weights through FP8 too (quantised from fp32, as every sync's).
  if (c.engine_fp8 && c.engine_model && c.rl)
    load_fp8_engine_weights(*c.engine_model, uint64_t(ctx.deck.get_int("run.seed")),
                            resume_from.empty() ? ctx.deck.get_string("model.init_from") : std::string());
}

void load_fp8_engine_weights(Transformer& engine, uint64_t seed, const std::string& path, const std::string& group) {
  Transformer masters(engine.config(), seed, engine.device());  // fp32, whole: the seeded init or the file's
  if (!path.empty()) load_model_weights(masters.parameters(), path, group);
  if (!engine.sharded()) {
    copy_through_fp8(masters, engine);
    return;
  }
  Transformer whole(engine.config(), seed, engine.device(), engine.weight_dtype());
  copy_through_fp8(masters, whole);
  engine.copy_shard_from(whole);
}

}  // namespace slimpi
