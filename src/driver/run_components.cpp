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
#include "rollout/rollout_side.h"
#include "sync/engine_weights.h"
#include "sync/weight_route.h"
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

at::Device run_device(const RunContext& ctx) {
  return ctx.device.use_cuda ? at::Device(at::kCUDA, ctx.device.gpu) : at::Device(at::kCPU);
}

// On GPUs a sharded model's collectives run inside backward, on autograd's threads.
void check_sharding_backend(const RunContext& ctx) {
  const Deck& deck = ctx.deck;
  for (const char* key : {"parallel.expert_parallel", "parallel.tensor_parallel", "parallel.context_parallel"})
    if (const int64_t n = deck.get_int(key); n > 1 && ctx.device.use_cuda && !ctx.device.use_nccl)
      SLIMPI_FAIL_ALL("{} = {} ({}) shards the model over groups of {} trainer ranks: on GPUs its collectives run "
                      "inside backward, on autograd's own threads, where MPI may not be called; use "
                      "parallel.comm_backend = \"nccl\" or \"auto\" ({})",
                      key, n, deck.source(key), n, deck.source("parallel.comm_backend"));
}

// A resume whose reference weights are gone stops the whole job, not the trainers
// alone (only they read the file: rollout nodes may not even mount its path).
void check_reference_present(const RunContext& ctx, const std::string& resume_from, const RunComponents& c) {
  const std::string& init_from = ctx.deck.get_string("model.init_from");
  int reference_gone = !init_from.empty() && !resume_from.empty() && Trainer::needs_reference(c.configs.trainer) &&
                       ctx.world->is_trainer() && !std::filesystem::exists(init_from);
  MPI_Allreduce(MPI_IN_PLACE, &reference_gone, 1, MPI_INT, MPI_MAX, ctx.world->world());
  if (reference_gone)
    SLIMPI_FAIL_ALL("model.init_from = \"{}\" ({}) is gone: the reference model of the KL terms is those "
                    "weights (a checkpoint holds the policy only); restore the file to resume",
                    init_from, ctx.deck.source("model.init_from"));
}

// A trainer rank's model (its tensor and expert shard, context split and pipeline stage), its weights from
// model.init_from when `load`.
std::unique_ptr<Transformer> make_trainer_model(const RunContext& ctx, const RunComponents& c,
                                                const ModelParallel& mp, bool load) {
  const ModelConfig& cfg = c.configs.model;
  const ExpertShard experts = mp.expert_shard();
  const TensorShard tensor = mp.tensor_shard();
  auto m = std::make_unique<Transformer>(cfg, run_seed(ctx.deck), run_device(ctx), at::kFloat, experts, tensor,
                                         mp.context_shard(), mp.pipeline_shard(pipeline_layer_counts(ctx.deck, cfg)));
  const std::string& init_from = ctx.deck.get_string("model.init_from");
  if (load && !init_from.empty())
    load_model_weights(m->parameters(), init_from, "model", experts.size > 1, StoredWhole{&cfg, tensor},
                       m->pipeline_shard());
  return m;
}

// What tensor, expert and optimizer sharding put on this trainer rank (rank 0 says it).
void describe_model_parallel(const Deck& deck, const ModelConfig& cfg, const ModelParallel& mp,
                             const Transformer& policy, bool distributed_optimizer) {
  const int tp = mp.tensor_size(), ep = int(deck.get_int("parallel.expert_parallel"));
  const int n_tensor_groups = mp.data_size() * mp.context_size() * mp.pipeline_size();
  if (tp > 1)
    log::info("tensor parallelism: {} group{} of {} trainer ranks (data-parallel size {}); this rank is tensor rank "
              "{}: {} of {} query heads, {} of {} MLP columns, vocabulary rows {}..{} of {} padded ({} parameters "
              "here){}", n_tensor_groups, n_tensor_groups > 1 ? "s" : "", tp, mp.data_size(), mp.tensor_rank(),
              cfg.n_heads / tp, cfg.n_heads, cfg.intermediate_size / tp, cfg.intermediate_size, policy.vocab_begin(),
              policy.vocab_begin() + padded_vocab_size(cfg.vocab_size, tp) / tp - 1,
              padded_vocab_size(cfg.vocab_size, tp), policy.n_params(),
              mp.tensor_shard().sequence_parallel ? "; sequence parallel: norms and residuals hold 1/" +
                                                        std::to_string(tp) + " of the tokens" : "");
  if (const int rep = kv_head_replicas(cfg, tp); rep > 1)
    log::info("key/value heads replicated: the model's {} key/value heads are fewer than the {} ranks of a tensor "
              "group, so each is held whole by {} consecutive tensor ranks (the ones whose query heads attend with "
              "it), which sum its gradients; this rank holds key/value head {}", cfg.n_kv_heads, tp, rep,
              mp.tensor_rank() / rep);
  if (tp > 1 && cfg.is_hybrid())
    log::info("tensor parallelism of the Gated DeltaNet layers: this rank runs {} of {} linear key heads and the {} of "
              "{} value heads that read them (their projections, convolution channels and recurrent state), out_proj "
              "row-parallel", cfg.linear_num_key_heads / tp, cfg.linear_num_key_heads, cfg.linear_num_value_heads / tp,
              cfg.linear_num_value_heads);
  if (const int cp = mp.context_size(); cp > 1)
    log::info("context parallelism: {} group{} of {} trainer ranks (data-parallel size {}); this rank is context rank "
              "{}: chunks {} and {} of the {} of every packed sequence; attention gathers keys and values over the "
              "group, gradients are summed over its {} data x context replicas", n_tensor_groups / cp * tp,
              n_tensor_groups / cp * tp > 1 ? "s" : "", cp, mp.data_size(), mp.context_rank(), mp.context_rank(),
              2 * cp - 1 - mp.context_rank(), 2 * cp, mp.replicas().size());
  if (const int pp = mp.pipeline_size(); pp > 1) {
    const PipelineShard& stage = policy.pipeline_shard();
    std::string last;  // what the last stage holds beside its layers
    if (stage.last()) {
      last = cfg.tie_word_embeddings ? ", the final norm and a copy of the tied embedding as the head"
                                     : ", the final norm and the head";
      if (cfg.mtp_num_layers > 0)
        last += fmt::format(", the {} MTP layer{}{}", cfg.mtp_num_layers, cfg.mtp_num_layers > 1 ? "s" : "",
                            cfg.tie_word_embeddings ? "" : " and a copy of the embedding (their token input)");
    }
    log::info("pipeline parallelism: {} pipeline{} of {} stages (1F1B over the micro-batches); this rank is stage {}: "
              "layers {}..{}{}{} ({} parameters here)", n_tensor_groups / pp * tp, n_tensor_groups / pp * tp > 1 ? "s" : "",
              pp, stage.stage, stage.first_layer, stage.end_layer - 1, stage.first() ? ", the embedding" : "", last,
              policy.n_params());
  }
  if (distributed_optimizer)
    log::info("distributed optimizer: the AdamW moments sharded over the {} data{}-parallel rank{} of each tensor "
              "rank{}{}", mp.replicas().size(), mp.context_size() > 1 ? " and context" : "",
              mp.replicas().size() > 1 ? "s" : "", mp.pipeline_size() > 1 ? " and stage" : "",
              ep > 1 ? fmt::format(" (the experts' over their {} replicas)", mp.replicas().size() / ep) : "");
  if (ep > 1) {
    const ExpertShard shard = mp.expert_shard();
    std::string where;  // under pipeline parallelism: of which layers
    if (mp.pipeline_size() > 1) {
      const PipelineShard& stage = policy.pipeline_shard();
      int64_t n_moe = 0;
      for (int64_t l = stage.first_layer; l < stage.end_layer; ++l) n_moe += cfg.is_moe_layer(l) ? 1 : 0;
      where = n_moe > 0 ? fmt::format(" in each of its stage's {} MoE layers", n_moe)
                        : " in MoE layers, of which its stage has none";
    }
    log::info("expert parallelism: {} group{} of {} data-{}parallel ranks{}; this rank holds experts {}..{} of {}{} ({} "
              "parameters here)", mp.replicas().size() / ep, mp.replicas().size() / ep > 1 ? "s" : "", ep,
              mp.context_size() > 1 ? " and context-" : "", mp.pipeline_size() > 1 ? " of a stage" : "",
              shard.first(cfg.n_experts), shard.first(cfg.n_experts) + shard.count(cfg.n_experts) - 1,
              cfg.n_experts, where, policy.n_params());
  }
}

// Trainer ranks: the model-parallel groups, the policy (from model.init_from on a fresh
// start; a resumed job takes it from its checkpoint), the frozen reference (always
// model.init_from: checkpoints do not hold it), the trainer and a trainer-side teacher.
void build_trainer_models(const RunContext& ctx, const std::string& resume_from, RunComponents& c) {
  const Deck& deck = ctx.deck;
  const ModelConfig& model_cfg = c.configs.model;
  const int tp = int(deck.get_int("parallel.tensor_parallel"));
  c.model_parallel = std::make_unique<ModelParallel>(ctx.world->trainer(), tp,
                                                     int(deck.get_int("parallel.expert_parallel")), ctx.device,
                                                     deck.get_bool("parallel.sequence_parallel"),
                                                     kv_head_replicas(model_cfg, tp),
                                                     int(deck.get_int("parallel.context_parallel")),
                                                     int(deck.get_int("parallel.pipeline_parallel")));
  const ModelParallel& mp = *c.model_parallel;
  c.policy = make_trainer_model(ctx, c, mp, resume_from.empty());
  if (Trainer::needs_reference(c.configs.trainer)) {
    c.reference = make_trainer_model(ctx, c, mp, true);
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
                                        mp.expert_replicas(), &mp.replicas());
  if (c.configs.trainer.opd_kl_coef > 0 && c.configs.trainer.teacher_placement == "trainer") {
    c.teacher = load_teacher(*c.configs.teacher, run_device(ctx), c.policy->pipeline_shard());
    c.trainer->set_teacher(c.teacher.get());
  }
  const std::string& init_from = deck.get_string("model.init_from");
  log::info("policy: {} parameters ({} layers, d {}, {} heads / {} kv heads) on {}, from {}", model_cfg.n_params(),
            model_cfg.n_layers, model_cfg.hidden_size, model_cfg.n_heads, model_cfg.n_kv_heads,
            run_device(ctx).str(), init_from.empty() ? "the seeded init" : init_from);
  describe_model_parallel(deck, model_cfg, mp, *c.policy, c.configs.trainer.distributed_optimizer);
}

// Tensor-parallel engines and speculative decoding, as the deck sets them (rank 0 says it).
void describe_engines(const RunContext& ctx, const RunComponents& c, at::ScalarType rollout_weights) {
  const ModelConfig& cfg = c.configs.model;
  const WorldLayout& layout = ctx.world->layout();
  const int engine_tp = layout.engine_size;
  const bool own_shards = rollout_weights == at::kFloat && ctx.deck.get_int("parallel.expert_parallel") == 1;
  if (c.rl && engine_tp > 1)
    log::info("tensor-parallel engines: {} engine{} of {} {} (the first of each routes and samples); each "
              "rank holds {} of {} query heads, {}, {} of {} MLP columns{} and {}",
              layout.n_rollout / engine_tp, layout.n_rollout / engine_tp > 1 ? "s" : "", engine_tp,
              layout.placement == Placement::Colocate
                  ? (own_shards ? "ranks, each a tensor group of the trainer running the policy's own shards"
                                : "ranks, each a tensor group of the trainer running a copy of its shards refreshed at "
                                  "every step")
                  : "rollout ranks",
              cfg.n_heads / engine_tp, cfg.n_heads,
              cfg.is_mla() ? std::string("the key/value latent projections whole")
                           : fmt::format("{} of {} key/value heads{}", local_kv_heads(cfg, engine_tp), cfg.n_kv_heads,
                                         kv_head_replicas(cfg, engine_tp) > 1
                                             ? fmt::format(" (each replicated on {} ranks)",
                                                           kv_head_replicas(cfg, engine_tp))
                                             : ""),
              cfg.intermediate_size / engine_tp, cfg.intermediate_size,
              cfg.shared_experts_width() + cfg.shared_expert_intermediate_size > 0
                  ? " (the shared experts' too), every routed expert"
                  : cfg.n_experts > 0 ? ", every routed expert" : "",
              cfg.is_mla() ? "the whole latent KV cache (one row of the latent and the rotary key a token)"
              : cfg.is_hybrid()
                  ? fmt::format("its heads' KV cache and state slots ({} of {} linear key heads)",
                                cfg.linear_num_key_heads / engine_tp, cfg.linear_num_key_heads)
                  : std::string("its heads' KV cache"));
  if (const int64_t steps = c.configs.rollout.engine.spec_steps; c.rl && steps > 0)
    log::info("speculative decoding: chains of {} tokens drafted by the policy's first MTP depth and verified by exact "
              "rejection sampling{}; the draft is the policy's own MTP layers, in its weights (every weight sync "
              "carries it: the draft's version is the policy's)", steps,
              c.configs.rollout.engine.spec_max_running > 0
                  ? fmt::format(", none while more than {} sequences run", c.configs.rollout.engine.spec_max_running)
                  : std::string());
  if (const int64_t prefill = ctx.deck.get_int("rollout.prefill_ranks"); c.rl && prefill > 0)
    log::info("prefill/decode disaggregation: {} prefill engine(s) on the last rollout ranks hand the KV rows{} of "
              "the prompts they compute to {} decode engine(s)", prefill,
              cfg.is_hybrid() ? " and the linear layers' state" : "", layout.n_rollout - prefill);
}

// The engines' model where it is not the policy: their own on split rollout ranks; on
// colocated ranks a bf16 copy of the policy when the rollout runs in bf16. With model
// parallelism a colocated one-rank engine (or the SFT evaluation) runs a whole model of
// its own, gathered from the groups' shards before each use; a colocated engine of the
// tensor group's ranks (rollout.tensor_parallel = parallel.tensor_parallel) runs the
// policy's shards themselves, or its own copy of this rank's shard (bf16, or every
// expert where expert parallelism holds some of them). Weights: the seeded init here
// (sync/engine_weights.h loads them). Drawn in fp32 from the run seed whatever their
// dtype, so a bf16 engine model starts as the fp32 policy rounded once.
void build_engine_model(const RunContext& ctx, RunComponents& c, at::ScalarType rollout_weights) {
  const Deck& deck = ctx.deck;
  const WorldLayout& layout = ctx.world->layout();
  const int engine_tp = layout.engine_size;
  const bool sharded = deck.get_int("parallel.expert_parallel") > 1 || deck.get_int("parallel.tensor_parallel") > 1 ||
                       deck.get_int("parallel.pipeline_parallel") > 1;
  auto make = [&](at::ScalarType weights, const TensorShard& shard = {}) {
    return std::make_unique<Transformer>(c.configs.model, run_seed(deck), run_device(ctx), weights, ExpertShard{},
                                         shard);
  };
  if (c.rl && engine_tp > 1 && layout.placement == Placement::Colocate) {
    if (rollout_weights != at::kFloat || deck.get_int("parallel.expert_parallel") > 1) {
      TensorShard shard = c.model_parallel->tensor_shard();
      shard.sequence_parallel = false;  // an engine's forward holds every token (no gradients either)
      shard.kv_replicas = nullptr;
      c.engine_model = make(rollout_weights, shard);
    }
  } else if (c.rl && ctx.world->is_rollout() && engine_tp > 1) {  // split placement: one shard of a tensor-parallel engine
    c.engine_group_comm = make_comm(ctx.world->engine_group(), "engine_group", ctx.device);
    const TensorShard shard{c.engine_group_comm->rank(), engine_tp, c.engine_group_comm.get(), false};
    c.engine_model = make(rollout_weights, shard);
  } else if (c.rl && ctx.world->is_rollout() &&
             (!ctx.world->is_trainer() || rollout_weights != at::kFloat || sharded)) {
    c.engine_model = make(rollout_weights);
  }
  if (!c.rl && sharded && ctx.world->is_trainer() && !deck.get_string("eval.path").empty())
    c.engine_model = make(at::kFloat);
}

// The models of this rank: trainer ranks' policy, reference and teacher; the router's
// teacher (teacher.placement = "rollout"); the engines' own model.
void build_models(const RunContext& ctx, const std::string& resume_from, RunComponents& c) {
  check_sharding_backend(ctx);
  check_reference_present(ctx, resume_from, c);
  if (c.configs.trainer.opd_kl_coef > 0 && c.configs.trainer.teacher_placement == "rollout" &&
      ctx.world->rank() == c.router_world_rank)
    c.teacher = load_teacher(*c.configs.teacher, run_device(ctx));  // the router scores every kept sample
  if (ctx.world->is_trainer()) build_trainer_models(ctx, resume_from, c);
  const at::ScalarType rollout_weights = rollout_weight_dtype(ctx.deck.get_string("rollout.precision"));
  c.engine_fp8 = c.rl && ctx.deck.get_string("rollout.precision") == "fp8";
  describe_engines(ctx, c, rollout_weights);
  build_engine_model(ctx, c, rollout_weights);
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
}

}  // namespace

RunComponents::RunComponents() = default;
RunComponents::~RunComponents() = default;
RunComponents::RunComponents(RunComponents&&) noexcept = default;
RunComponents& RunComponents::operator=(RunComponents&&) noexcept = default;

RunComponents load_run_inputs(const RunContext& ctx, RunConfigs configs) {
  const Deck& deck = ctx.deck;
  RunComponents c;
  c.configs = std::move(configs);
  c.rl = deck.get_string("train.mode") == "rl";
  c.sample_block = static_cast<int>(deck.get_int("parallel.tensor_parallel") * deck.get_int("parallel.context_parallel") *
                                    deck.get_int("parallel.pipeline_parallel"));
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
  // The engines' own model starts as model.init_from (a resumed job's comes from its
  // checkpoint: Driver::load_checkpoint), through FP8 for an fp8 rollout.
  if (c.engine_model && resume_from.empty())
    load_engine_weights(*c.engine_model, c.engine_fp8, run_seed(ctx.deck), ctx.deck.get_string("model.init_from"));
  build_rollout(ctx, c);
  c.weight_route = make_weight_route({ctx.deck, *ctx.world, ctx.device, c.configs.model, c.policy.get(),
                                      c.engine_model.get(), c.model_parallel.get(), c.rl});
}

}  // namespace slimpi
