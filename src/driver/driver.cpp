#include "driver/driver.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>
#include <slimpi/sample.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "buffer/prompt_source.h"
#include "buffer/dynamic_filter.h"
#include "buffer/sample_transport.h"
#include "ckpt/checkpoint_dir.h"
#include "driver/async_generator.h"
#include "driver/rollout_batch.h"
#include "core/byte_codec.h"
#include "core/file_write.h"
#include "core/log.h"
#include "core/runtime_info.h"
#include "io/metrics_log.h"
#include "io/rollout_log.h"
#include "io/tensor_io.h"
#include "parallel/comm.h"
#include "parallel/mpi_bytes.h"
#include "parallel/watchdog.h"
#include "reward/reward.h"
#include "rollout/rollout_side.h"
#include "rollout/weight_sync.h"
#include "model/precision.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "train/advantages.h"
#include "train/sft_data.h"
#include "train/expert_parallel.h"
#include "train/trainer.h"

namespace slimpi {

// Everything one RL step carries from phase to phase.
struct Driver::StepState {
  RolloutBatch generated;        // generated this step (one_step_off: the next step's batch)
  std::vector<Sample> batch;     // trainers: their share of the trained batch's kept samples, then as trained
};

namespace {

uint64_t run_seed(const Deck& deck) { return static_cast<uint64_t>(deck.get_int("run.seed")); }

// The longest prompt a response of rollout.max_new_tokens still fits behind.
int64_t max_prompt_tokens(const Deck& deck) {
  return deck.get_int("model.max_seq_len") - deck.get_int("rollout.max_new_tokens");
}

// Streams of group seeds: training rollouts use the step; evaluation its own range.
constexpr uint64_t kEvalStream = uint64_t(1) << 40;

std::string encode_metrics(const std::map<std::string, double>& m) {
  ByteWriter w;
  w.put<uint64_t>(m.size());
  for (const auto& [k, v] : m) {
    w.put_string(k);
    w.put(v);
  }
  return w.take();
}

std::map<std::string, double> decode_metrics(const std::string& bytes) {
  ByteReader r(bytes);
  std::map<std::string, double> m;
  for (uint64_t n = r.get<uint64_t>(); n > 0; --n) {
    std::string k = r.get_string();
    m[k] = r.get<double>();
  }
  return m;
}

// GRPO-family estimators centre each reward on its group's mean: with one sample per
// group every advantage is 0 and nothing learns (slime's group math needs n >= 2).
void check_group_baseline(const Deck& deck) {
  const std::string& estimator = deck.get_string("train.advantage_estimator");
  if (deck.get_int("rollout.n_samples_per_prompt") > 1 || deck.get_bool("debug.rollout_only") ||
      deck.get_bool("train.disable_rewards_normalization") ||
      advantage_estimators().get(estimator).centring == RewardCentring::None)
    return;
  SLIMPI_FAIL_ALL("rollout.n_samples_per_prompt = 1 ({}) with train.advantage_estimator = \"{}\" ({}): each reward "
                  "is centred on its group's mean, its own, so every advantage is 0 and nothing learns; use groups of "
                  "2 or more, an estimator without a group baseline (reinforce_plus_plus), or "
                  "train.disable_rewards_normalization = true",
                  deck.source("rollout.n_samples_per_prompt"), estimator, deck.source("train.advantage_estimator"));
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

}  // namespace

Driver::Driver(RunContext& ctx)
    : ctx_(ctx), step_(std::make_unique<StepState>()), pending_(std::make_unique<RolloutBatch>()) {
  const Deck& deck = ctx_.deck;
  rl_ = deck.get_string("train.mode") == "rl";
  overlapped_ = deck.get_string("train.async") != "off";
  full_async_ = deck.get_string("train.async") == "full";
  const bool eval_on = !deck.get_string("eval.path").empty();
  const bool rollout_only = deck.get_bool("debug.rollout_only");
  const bool train_only = deck.get_bool("debug.train_only");
  const Phase weight_sync_phase{"weight_sync", rl_ && !rollout_only, &Driver::weight_sync};
  if (overlapped_) {
    // The engines get step k's weights first; rollout and reward (rollout ranks) then
    // overlap train (trainers) until record joins them.
    phases_ = {weight_sync_phase,
               {"eval", eval_on, &Driver::eval},
               {"buffer", true, &Driver::buffer},
               {"rollout", true, &Driver::rollout},
               {"reward", true, &Driver::reward},
               {"train", true, &Driver::train},
               {"record", true, &Driver::record},
               {"metrics", true, &Driver::metrics},
               {"checkpoint", true, &Driver::checkpoint}};
  } else {
    phases_ = {{"eval", eval_on, &Driver::eval},
               {"rollout", rl_ && !train_only, &Driver::rollout},
               {"reward", rl_ && !train_only, &Driver::reward},
               {"buffer", rl_, &Driver::buffer},
               {"train", !rollout_only, &Driver::train},
               {"record", true, &Driver::record},
               weight_sync_phase,
               {"metrics", true, &Driver::metrics},
               {"checkpoint", true, &Driver::checkpoint}};
  }
  const WorldLayout& layout = ctx_.world->layout();
  for (int r = 0; r < layout.world_size; ++r)
    if (layout.is_trainer(r)) trainer_world_ranks_.push_back(r);
  router_world_rank_ = rl_ && layout.placement == Placement::Split ? layout.n_trainer : 0;
  if (overlapped_) {
    const std::string why = fmt::format("train.async = \"{}\" ({}) overlaps generation on the rollout "
                                        "ranks with training on the trainer ranks",
                                        deck.get_string("train.async"), deck.source("train.async"));
    if (!rl_) SLIMPI_FAIL_ALL("{}: it needs train.mode = \"rl\" ({})", why, deck.source("train.mode"));
    if (layout.placement != Placement::Split)
      SLIMPI_FAIL_ALL("{}: with parallel.placement = \"colocate\" ({}) the same ranks do both, so nothing "
                      "overlaps; use placement = \"split\"",
                      why, deck.source("parallel.placement"));
    if (rollout_only || train_only)
      SLIMPI_FAIL_ALL("{}: debug.{} ({}) runs one side only; set train.async = \"off\"", why,
                      rollout_only ? "rollout_only" : "train_only",
                      deck.source(rollout_only ? "debug.rollout_only" : "debug.train_only"));
  }
  // Keys only train.async = "full" reads, and the sampling rounds it has none of.
  for (const char* key : {"rollout.queue_batches", "rollout.max_staleness", "rollout.stale_policy",
                          "rollout.partial", "rollout.mask_offpolicy_in_partial"})
    if (!full_async_ && !deck.has_default_value(key))
      SLIMPI_FAIL_ALL("{} ({}) applies to train.async = \"full\" only; train.async is \"{}\" ({})", key,
                      deck.source(key), deck.get_string("train.async"), deck.source("train.async"));
  if (full_async_ && deck.get_string("rollout.stale_policy") == "regenerate" && deck.get_int("rollout.max_staleness") < 0)
    SLIMPI_FAIL_ALL("rollout.stale_policy = \"regenerate\" ({}) needs a staleness bound: rollout.max_staleness is -1 "
                    "(none; {})",
                    deck.source("rollout.stale_policy"), deck.source("rollout.max_staleness"));
  if (full_async_ && deck.get_bool("rollout.mask_offpolicy_in_partial") && deck.get_string("rollout.partial") == "discard")
    SLIMPI_FAIL_ALL("rollout.mask_offpolicy_in_partial ({}) has nothing to mask with rollout.partial = \"discard\" ({}): "
                    "a discarded response starts again, so every sample's tokens are of one weight version",
                    deck.source("rollout.mask_offpolicy_in_partial"), deck.source("rollout.partial"));

  if (deck.get_string("data.path").empty())
    SLIMPI_FAIL_ALL("train.mode = \"{}\" ({}) needs a data file: set data.path", deck.get_string("train.mode"),
                    deck.source("train.mode"));
  tokenizer_ = make_tokenizer(deck);
  log::info("tokenizer: {}", tokenizer_->describe());
  if (const std::string note = describe_chat_template_choice(deck, *tokenizer_); !note.empty()) log::info("{}", note);
  if (eval_on) {
    // Every rank reads the files, so that a bad file is an error all ranks raise alike.
    PromptSourceSpec spec = PromptSourceSpec::from_deck(deck, deck.get_string("eval.path"), tokenizer_);
    spec.max_prompt_tokens = max_prompt_tokens(deck);
    eval_prompts_ = PromptSource(spec, run_seed(deck)).records();
  }
  if (rl_) {
    const int64_t per_step = deck.get_int("rollout.rollout_batch_size") * deck.get_int("rollout.n_samples_per_prompt");
    if (deck.get_int("train.num_steps_per_rollout") > per_step)
      SLIMPI_FAIL_ALL("train.num_steps_per_rollout = {} ({}) exceeds the {} samples of a step "
                      "(rollout.rollout_batch_size x rollout.n_samples_per_prompt): an optimizer step would get none",
                      deck.get_int("train.num_steps_per_rollout"), deck.source("train.num_steps_per_rollout"), per_step);
    check_group_baseline(deck);
    describe_optimizer_steps(deck, per_step);
  }
  check_debug_modes();
  choose_resume();
  set_up_model_and_trainer();
  set_up_rollout();
  resume_and_open_files();
  for (const auto& p : phases_)
    if (!p.built) log::info("step table: phase '{}' is not used in this mode and is skipped every step", p.name);
}

Driver::~Driver() = default;

void Driver::set_up_model_and_trainer() {
  const Deck& deck = ctx_.deck;
  ModelConfig model_cfg = ModelConfig::from_deck(deck);
  TrainerConfig train_cfg = TrainerConfig::from_deck(deck);
  if (!rl_) {
    sft_data_ = std::make_unique<SftData>(deck.get_string("data.path"), deck.get_string("data.input_key"),
                                          deck.get_string("data.response_key"), model_cfg.max_seq_len,
                                          run_seed(deck), *tokenizer_, ChatFormat::from_deck(deck, *tokenizer_));
  } else {
    PromptSourceSpec spec = PromptSourceSpec::from_deck(deck, deck.get_string("data.path"), tokenizer_);
    spec.metadata_key = deck.get_string("data.metadata_key");
    spec.skip_bad_lines = deck.get_bool("data.skip_bad_lines");
    spec.max_prompt_tokens = max_prompt_tokens(deck);
    prompt_source_ = std::make_unique<PromptSource>(spec, run_seed(deck));
  }
  const at::Device device = ctx_.device.use_cuda ? at::Device(at::kCUDA, ctx_.device.gpu) : at::Device(at::kCPU);
  const std::string& init_from = deck.get_string("model.init_from");
  // A resumed job takes the policy from its checkpoint: model.init_from is read only
  // for a fresh start, and for the frozen reference model (which checkpoints do not hold).
  // Weights are drawn in fp32 from the run seed whatever their dtype, so a bf16 engine
  // model starts as the fp32 policy rounded once.
  // Expert parallelism: trainer ranks hold one block of the experts (train/expert_parallel.h).
  const int ep = static_cast<int>(deck.get_int("parallel.expert_parallel"));
  if (ep > 1) {
    const int n_trainer = ctx_.world->layout().n_trainer;
    const std::string what = fmt::format("parallel.expert_parallel = {} ({}) shards the experts over groups of {} "
                                         "trainer ranks", ep, deck.source("parallel.expert_parallel"), ep);
    if (model_cfg.n_experts == 0)
      SLIMPI_FAIL_ALL("{}, but the model has none: model.n_experts = 0 ({})", what, deck.source("model.n_experts"));
    if (model_cfg.n_experts % ep != 0)
      SLIMPI_FAIL_ALL("{}: it must divide model.n_experts = {} ({})", what, model_cfg.n_experts,
                      deck.source("model.n_experts"));
    if (n_trainer % ep != 0)
      SLIMPI_FAIL_ALL("{}: it must divide the number of trainer ranks, {} (parallel.trainer_ranks, {}; "
                      "parallel.placement, {})",
                      what, n_trainer, deck.source("parallel.trainer_ranks"), deck.source("parallel.placement"));
    if (ctx_.device.use_cuda && !ctx_.device.use_nccl)
      SLIMPI_FAIL_ALL("{}: on GPUs its token exchange runs inside backward, on autograd's own threads, where MPI "
                      "may not be called; use parallel.comm_backend = \"nccl\" or \"auto\" ({})",
                      what, deck.source("parallel.comm_backend"));
  }
  auto make_model = [&](bool is_reference, at::ScalarType weights, const ExpertShard& shard = {}) {
    auto m = std::make_unique<Transformer>(model_cfg, run_seed(deck), device, weights, shard);
    if (!init_from.empty() && (resume_from_.empty() || is_reference)) {
      if (!resume_from_.empty() && !std::filesystem::exists(init_from))
        SLIMPI_FAIL_ALL("model.init_from = \"{}\" ({}) is gone: the reference model of the KL terms is those "
                        "weights (a checkpoint holds the policy only); restore the file to resume",
                        init_from, deck.source("model.init_from"));
      load_model_weights(m->parameters(), init_from, "model", shard.size > 1);
    }
    return m;
  };
  if (ctx_.world->is_trainer()) {
    trainer_comm_ = make_comm(ctx_.world->trainer(), "trainer", ctx_.device);
    if (ep > 1) expert_groups_ = std::make_unique<ExpertGroups>(ctx_.world->trainer(), ep, ctx_.device);
    const ExpertShard shard = expert_groups_ ? expert_groups_->shard() : ExpertShard{};
    policy_ = make_model(false, at::kFloat, shard);
    if (Trainer::needs_reference(train_cfg)) {
      reference_ = make_model(true, at::kFloat, shard);
      for (auto& p : reference_->parameters()) p.tensor.set_requires_grad(false);
    }
    trainer_ = std::make_unique<Trainer>(train_cfg, *policy_, trainer_comm_.get(), reference_.get(),
                                         expert_groups_ ? &expert_groups_->replicas() : nullptr);
    log::info("policy: {} parameters ({} layers, d {}, {} heads / {} kv heads) on {}, from {}", model_cfg.n_params(),
              model_cfg.n_layers, model_cfg.hidden_size, model_cfg.n_heads, model_cfg.n_kv_heads, device.str(),
              init_from.empty() ? "the seeded init" : init_from);
    if (expert_groups_)
      log::info("expert parallelism: {} group{} of {} trainer ranks; this rank holds experts {}..{} of {} ({} "
                "parameters here)", ctx_.world->layout().n_trainer / ep, ctx_.world->layout().n_trainer / ep > 1 ? "s" : "",
                ep, shard.first(model_cfg.n_experts),
                shard.first(model_cfg.n_experts) + shard.count(model_cfg.n_experts) - 1, model_cfg.n_experts,
                policy_->n_params());
  }
  // The engines' model: their own on split rollout ranks; on colocated ranks the
  // policy itself, or a bf16 copy of it when the rollout runs in bf16.
  const at::ScalarType rollout_weights = weight_dtype(parse_precision(deck.get_string("rollout.precision")));
  engine_weight_dtype_ = rollout_weights;
  // With expert parallelism a colocated engine (or the SFT evaluation) runs a whole
  // model of its own, gathered from the group's shards before each use.
  if (rl_ && ctx_.world->is_rollout() && (!ctx_.world->is_trainer() || rollout_weights != at::kFloat || ep > 1))
    engine_model_ = make_model(false, rollout_weights);
  if (!rl_ && ep > 1 && ctx_.world->is_trainer() && !deck.get_string("eval.path").empty())
    engine_model_ = make_model(false, at::kFloat);
  if (sft_data_) {
    if (!ctx_.world->is_trainer()) sft_data_.reset();
    else log::info("SFT data: {} samples from {}", sft_data_->size(), deck.get_string("data.path"));
  }
  if (prompt_source_)
    log::info("prompts: {} from {} ({} bad lines skipped)", prompt_source_->size(), deck.get_string("data.path"),
              prompt_source_->n_skipped_lines());
}

void Driver::set_up_rollout() {
  const Deck& deck = ctx_.deck;
  RolloutConfig rc = RolloutConfig::from_deck(deck);
  RewardConfig::from_deck(deck);  // checked on every rank
  const bool eval_on = !eval_prompts_.empty();
  if (rl_ && ctx_.world->is_rollout()) {
    const Transformer& model = engine_model_ ? *engine_model_ : *policy_;
    rollout_side_ = std::make_unique<RolloutSide>(rc, model, ctx_.world->rollout(), run_seed(deck));
  } else if (!rl_ && eval_on && ctx_.world->is_trainer()) {
    rollout_side_ = std::make_unique<RolloutSide>(rc, engine_model_ ? *engine_model_ : *policy_, ctx_.world->trainer(),
                                                  run_seed(deck));
  }
  if (full_async_ && rollout_side_)
    async_ = std::make_unique<AsyncGenerator>(deck, *rollout_side_, *prompt_source_, *tokenizer_, run_seed(deck));
  if (rl_ && ctx_.world->sync() != MPI_COMM_NULL) {
    sync_comm_ = make_comm(ctx_.world->sync(), "sync", ctx_.device);
    weight_sync_ = std::make_unique<WeightSync>(*sync_comm_, deck.get_int("rollout.weight_sync_bucket_mb") << 20);
  }
}

int64_t Driver::run() {
  const int64_t n_steps = ctx_.deck.get_int("run.n_steps");
  if (start_step_ >= n_steps && !resume_from_.empty()) {
    log::info("the run is already at step {} (checkpoint {}), run.n_steps = {} ({}): nothing to do", start_step_,
              resume_from_, n_steps, ctx_.deck.source("run.n_steps"));
    mark_run_complete(start_step_);
    return start_step_;
  }
  log::info("running steps {}..{} of {} ({})", start_step_ + 1, n_steps, n_steps, rl_ ? "rl" : "sft");
  Stopwatch total;
  int64_t step = start_step_;
  for (; step < n_steps && !stop_ && !halt_; ++step) {
    step_clock_.restart();
    phase_times_.clear();
    step_metrics_.clear();
    *step_ = StepState();
    generation_s_ = 0;
    for (const auto& p : phases_) {
      if (!p.built) continue;
      Stopwatch clock;
      (this->*p.body)(step);
      phase_times_[fmt::format("time/{}_s", p.name)] = clock.seconds();
    }
  }
  if (halt_) {
    log::info("stopped at the step boundary after step {} of {} in {:.3f} s; run the same command again to continue "
              "from {}/{}",
              step, n_steps, total.seconds(), ckpt_root_, ckpt::step_dir_name(step));
    return step;
  }
  if (!eval_prompts_.empty()) {  // the final evaluation: row n_steps
    step_metrics_.clear();
    if (overlapped_) push_weights(step);  // the engines hold the previous step's weights
    run_eval(step);
    log_metrics([&] { metrics_->log_step(step, step_metrics_); });
    if (step_metrics_.count("eval/pass@1"))
      log::info("final eval (after {} steps): pass@1 {:.3f}", step, step_metrics_.at("eval/pass@1"));
  }
  const std::string state_path = ctx_.run_dir + "/trainer_state.h5";
  run_on_all_and_agree(ctx_.world->world(), "writing " + state_path, [&] {
    if (trainer_ && writes_trainer_state()) trainer_->save(state_path);
  });
  if (trainer_ && rank_in(ctx_.world->trainer()) == 0)
    log::info("trainer state (model, optimizer, RNG) written to {}", state_path);
  mark_run_complete(step);
  if (n_short_batches_ > 0)
    log::info("{} of the {} steps of this job trained a short batch (rollout/short_batch_groups in metrics.h5)",
              n_short_batches_, step - start_step_);
  log::info("finished: step {} of {} in {:.3f} s; outputs in {}", step, n_steps, total.seconds(), ctx_.run_dir);
  return step;
}

void Driver::share_metrics(int root, std::map<std::string, double> values) {
  std::string bytes = ctx_.world->rank() == root ? encode_metrics(values) : std::string();
  broadcast_string(ctx_.world->world(), bytes, root);
  for (const auto& [k, v] : decode_metrics(bytes)) step_metrics_[k] = v;
}

void Driver::log_metrics(const std::function<void()>& write) {
  run_on_all_and_agree(ctx_.world->world(), "[metrics] writing " + metrics_->h5_path(), write);
}

void Driver::mark_run_complete(int64_t steps) {
  run_on_all_and_agree(ctx_.world->world(), "the run's COMPLETE marker", [&] {
    if (ctx_.world->rank() == 0) write_file(ctx_.run_dir + "/COMPLETE", fmt::format("run complete: {} steps\n", steps));
  });
}

bool Driver::writes_trainer_state() const {
  // Trainer rank 0 writes; with expert parallelism its group gathers the experts with it.
  return rank_in(ctx_.world->trainer()) == 0 || (expert_groups_ && expert_groups_->group_index() == 0);
}

void Driver::run_eval(int64_t row) {
  std::map<std::string, double> m;
  if (!rl_ && expert_groups_) gather_whole_model(*policy_, engine_model_.get());  // SFT: the trainers evaluate
  if (rollout_side_)
    m = rollout_side_->evaluate(eval_prompts_, RewardConfig::from_deck(ctx_.deck), ctx_.deck.get_int("eval.n_samples"),
                                kEvalStream + uint64_t(row) * 2);
  share_metrics(router_world_rank_, m);
  const double target = ctx_.deck.get_float("eval.stop_at_pass1");
  if (target > 0 && step_metrics_.count("eval/pass@1") && step_metrics_.at("eval/pass@1") >= target) {
    stop_ = true;
    log::info("eval/pass@1 = {:.3f} reached eval.stop_at_pass1 = {}: the run ends after this step",
              step_metrics_.at("eval/pass@1"), target);
  }
}

void Driver::eval(int64_t step) {
  const int64_t interval = ctx_.deck.get_int("eval.interval");
  if (step == 0 || (interval > 0 && step % interval == 0)) run_eval(step);
}

bool Driver::generates_next_batch() const {
  // The last step too: its checkpoint then holds the next batch, so a run extended by
  // raising run.n_steps continues exactly as a longer straight run (one batch of extra
  // generation per run). Not once eval.stop_at_pass1 ended the run: nothing continues it.
  return overlapped_ && !stop_;
}

RolloutBatch& Driver::batch_to_train() { return overlapped_ ? *pending_ : step_->generated; }

void Driver::rollout(int64_t step) {
  if (!rollout_side_) return;
  if (full_async_) {
    // Generate until the trainers are done training (they enter the barrier in record).
    if (!generates_next_batch()) return;
    MPI_Request trainers_done;
    check_mpi(MPI_Ibarrier(ctx_.world->world(), &trainers_done), "MPI_Ibarrier");
    trainers_done_posted_ = true;
    async_->generate_while_training(step + 1, &trainers_done);
    generation_s_ += async_->take_busy_seconds();
    return;
  }
  if (!overlapped_) {
    generate_batch(step, step_->generated);
  } else if (generates_next_batch()) {
    generate_batch(step + 1, step_->generated);  // with this step's weights, while the trainers train
  }
}

void Driver::generate_batch(int64_t step, RolloutBatch& out) {
  Stopwatch rounds_clock;
  const Deck& deck = ctx_.deck;
  const RolloutConfig& rc = rollout_side_->config();
  const int64_t want = deck.get_int("rollout.rollout_batch_size");
  const int64_t per_round = deck.get_int("rollout.over_sampling_batch_size") > 0
                                ? deck.get_int("rollout.over_sampling_batch_size")
                                : want;
  const DynamicFilter& filter = dynamic_filters().get(deck.get_string("rollout.dynamic_filter"));
  const int64_t max_rounds = filter.is_identity() ? 1 : deck.get_int("rollout.max_sampling_rounds");
  const RewardConfig reward = RewardConfig::from_deck(deck);
  const int64_t n = rc.n_samples_per_prompt;
  const Tokenizer& tok = *tokenizer_;
  int kept = 0;
  for (int64_t round = 0; round < max_rounds && kept < want; ++round) {
    // Draw the round's prompts, generate their groups, score them, filter the groups.
    const int64_t first_group = out.groups_generated;
    std::vector<Prompt> prompts = prompt_source_->next(per_round);
    std::vector<Sample> samples =
        rollout_side_->generate(prompts, first_group, uint64_t(step), n, rc.sampling, &out.engine_stats);
    out.groups_generated += per_round;
    ++out.rounds;
    if (rollout_side_->is_router()) {
      Stopwatch clock;
      std::vector<RewardInput> batch;
      for (const auto& s : samples) {
        const Prompt& p = prompts[s.group_index - first_group];
        batch.push_back({p.text, tok.decode({s.tokens.begin() + s.prompt_length, s.tokens.end()}), p.label});
      }
      std::vector<float> r = compute_rewards(reward, batch);
      out.score_s += clock.seconds();
      for (size_t g = 0; g * n < samples.size(); ++g) {
        std::vector<float> group_rewards(r.begin() + g * n, r.begin() + (g + 1) * n);
        const bool keep = filter.keep(group_rewards);
        const bool surplus = keep && kept >= want;
        if (!keep) ++out.groups_dropped;
        if (keep && !surplus) ++kept;
        for (int64_t i = 0; i < n; ++i) {
          Sample s = std::move(samples[g * n + i]);
          s.step = step;
          s.raw_reward = r[g * n + i];
          if (!keep || surplus) {  // dropped by the filter, or over-sampling surplus
            s.status = keep ? SampleStatus::Aborted : SampleStatus::Filtered;
            s.reward = keep ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
            out.unused.push_back(std::move(s));
          } else {
            out.kept.push_back(std::move(s));
          }
        }
      }
    }
    static const std::string kept_context = "[rollout] the router's count of kept groups";
    WaitGuard guard({&kept_context, "MPI_Bcast", 1, "i32", 0});
    MPI_Bcast(&kept, 1, MPI_INT, 0, ctx_.world->rollout());
  }
  out.generate_s += rounds_clock.seconds();
  generation_s_ += rounds_clock.seconds();
  if (rollout_side_->is_router() && kept < want && !said_short_batch_) {
    log::warn("step {}: the dynamic filter kept {} of {} groups after {} rounds; training on those (rewards "
              "normalised per group). Said once: rollout/short_batch_groups in metrics.h5 counts every short batch",
              step, kept, want, out.rounds);
    said_short_batch_ = true;
  }
}

void Driver::reward(int64_t) { postprocess_batch_rewards(step_->generated); }

void Driver::postprocess_batch_rewards(RolloutBatch& st) {
  // Group post-processing of the kept groups' rewards (per group, also in a short
  // batch: slime never trains one, and per group is what its normalisation means).
  if (!rollout_side_ || !rollout_side_->is_router()) return;
  const Deck& deck = ctx_.deck;
  if (st.kept.empty()) return;
  const int64_t n = rollout_side_->config().n_samples_per_prompt;
  RewardNormalization norm{!deck.get_bool("train.disable_rewards_normalization"),
                           !deck.get_bool("train.disable_grpo_std_normalization")};
  std::vector<float> raw;
  for (const auto& s : st.kept) raw.push_back(s.raw_reward);
  std::vector<float> rewards = postprocess_rewards(deck.get_string("train.advantage_estimator"), raw, n, norm);
  for (size_t i = 0; i < st.kept.size(); ++i) st.kept[i].reward = rewards[i];
}

void Driver::buffer(int64_t step) {
  std::map<std::string, double> async_metrics;
  if (full_async_) {
    // The next rollout_batch_size groups of the queue (generated first if it is short).
    if (async_) {
      async_metrics = async_->take_batch(step, *pending_);
      generation_s_ += async_->take_busy_seconds();
    }
    postprocess_batch_rewards(*pending_);
    pending_ready_ = true;
  }
  if (overlapped_ && !pending_ready_) {
    // The first step of a fresh run (or of a resume from a checkpoint without a pending
    // batch) generates its own batch, with its weights, before anything overlaps.
    if (rollout_side_) generate_batch(step, *pending_);
    postprocess_batch_rewards(*pending_);
    pending_ready_ = true;
  }
  RolloutBatch& st = batch_to_train();
  static const std::string waiting_for_rollouts = "[buffer] trainers waiting for the step's rollouts";
  idle_barrier(ctx_.world->world(), waiting_for_rollouts);
  if (ctx_.deck.get_bool("debug.train_only")) {  // replay: the recorded samples of this step
    step_->batch = recorded_batch(step);
    return;
  }
  const bool router = ctx_.world->rank() == router_world_rank_;
  std::map<std::string, double> m;
  if (router) {
    // Rollout metrics (slime's names) of the kept samples.
    const double n = std::max<double>(1, double(st.kept.size()));
    double raw = 0, rew = 0, len = 0, max_len = 0, truncated = 0;
    for (const Sample& s : st.kept) {
      raw += s.raw_reward;
      rew += s.reward;
      len += double(s.response_length());
      max_len = std::max(max_len, double(s.response_length()));
      truncated += s.status == SampleStatus::Truncated;
    }
    const int64_t k = rollout_side_->config().n_samples_per_prompt;
    const int64_t want = ctx_.deck.get_int("rollout.rollout_batch_size");
    const int64_t kept_groups = int64_t(st.kept.size()) / k;
    int64_t zero_std = 0;
    for (int64_t g = 0; g < kept_groups; ++g) {
      bool same = true;
      for (int64_t i = 1; i < k; ++i) same &= st.kept[g * k + i].raw_reward == st.kept[g * k].raw_reward;
      zero_std += same;
    }
    const EngineStats& es = st.engine_stats;
    m["rollout/raw_reward"] = raw / n;
    m["rollout/rewards"] = rew / n;
    m["rollout/response_len/mean"] = len / n;
    m["rollout/response_len/max"] = max_len;
    m["rollout/truncated_ratio"] = truncated / n;
    m["rollout/zero_std/count"] = double(zero_std);
    m["rollout/dynamic_filter/drop_zero_std"] = double(st.groups_dropped);
    m["rollout/short_batch_groups"] = double(std::max<int64_t>(0, want - kept_groups));
    m["rollout/groups_generated"] = double(st.groups_generated);
    m["rollout/sampling_rounds"] = double(st.rounds);
    m["rollout/generated_tokens"] = double(es.generated_tokens);
    m["rollout/prefill_tokens_computed"] = double(es.prefill_tokens_computed);
    m["rollout/prompt_tokens_served"] = double(es.prompt_tokens_served);
    m["rollout/prefix_cache_hit_rate"] =
        es.prefix_query_tokens ? double(es.prefix_hit_tokens) / double(es.prefix_query_tokens) : 0.0;
    m["rollout/preemptions"] = double(es.preemptions);
    m["rollout/skipped_lines"] = double(prompt_source_->n_skipped_lines());
    m["rollout/prompt_cursor"] = double(prompt_source_->cursor());
    m["rollout/epoch"] = double(prompt_source_->epoch());
    m["perf/reward_score_time"] = st.score_s;
    if (st.generate_s > 0) m["perf/rollout_tokens_per_s"] = double(es.generated_tokens) / st.generate_s;
    if (es.iterations > 0) m["perf/engine_iteration_s"] = (es.forward_s + es.sample_s) / double(es.iterations);
    // Versions behind the trainer's: the oldest token of each trained sample.
    double stale_sum = 0, stale_max = 0;
    for (const Sample& s : st.kept) {
      const int64_t oldest = s.weight_versions.empty()
                                 ? step
                                 : *std::min_element(s.weight_versions.begin(), s.weight_versions.end());
      stale_sum += double(step - oldest);
      stale_max = std::max(stale_max, double(step - oldest));
    }
    m["rollout/staleness/mean"] = stale_sum / n;
    m["rollout/staleness/max"] = stale_max;
    for (const auto& [k, v] : async_metrics) m[k] = v;
  }
  share_metrics(router_world_rank_, m);
  if (step_metrics_.count("rollout/short_batch_groups") && step_metrics_.at("rollout/short_batch_groups") > 0)
    ++n_short_batches_;
  // Every rank follows the router's prompt cursor (it drew as many rounds as needed).
  if (prompt_source_) prompt_source_->set_cursor(int64_t(step_metrics_.at("rollout/prompt_cursor")));
  if (ctx_.deck.get_bool("debug.rollout_only")) {
    if (router) step_->batch = std::move(st.kept);  // logged as generated; nothing trains
    return;
  }
  step_->batch = scatter_samples(ctx_.world->world(), router_world_rank_, trainer_world_ranks_, st.kept);
}

void Driver::train(int64_t step) {
  // Colocated ranks may give the engine's KV pool back to training (slime's sleep/wake):
  // the next rollout builds it again.
  if (rollout_side_ && trainer_ && rl_ && rollout_side_->config().offload_between_phases) rollout_side_->offload();
  if (!trainer_) return;
  const Deck& deck = ctx_.deck;
  if (!rl_) {
    const int64_t batch = deck.get_int("train.global_batch_size");
    std::vector<Sample> local = sft_data_->batch(step, batch, trainer_comm_->rank(), trainer_comm_->size());
    auto m = trainer_->train_step(local);
    for (const auto& [k, v] : m) step_metrics_[k] = v;
    return;
  }
  std::vector<Sample>& local = step_->batch;
  int64_t n_global = static_cast<int64_t>(local.size());
  {
    static const std::string context = "[train] samples of the step over the trainers";
    WaitGuard guard({&context, "MPI_Allreduce", 1, "i64"});
    MPI_Allreduce(MPI_IN_PLACE, &n_global, 1, MPI_INT64_T, MPI_SUM, ctx_.world->trainer());
  }
  if (n_global == 0) {
    log::warn("step {}: no samples to train on (every group was filtered out)", step);
    return;
  }
  int64_t n_steps = deck.get_int("train.num_steps_per_rollout");
  if (n_steps == 0) n_steps = std::max<int64_t>(1, n_global / deck.get_int("train.global_batch_size"));
  if (n_steps > n_global) {  // a short batch (the filter kept few groups): no empty optimizer step
    log::warn("step {}: {} samples for train.num_steps_per_rollout = {}: taking {} optimizer steps", step, n_global,
              n_steps, n_global);
    n_steps = n_global;
  }
  // Reference and old log-probs, KL, advantages and their whitening: once per rollout.
  for (const auto& [k, v] : trainer_->prepare_rollout(local, /*recompute_old=*/n_steps > 1)) step_metrics_[k] = v;
  std::map<std::string, double> sums;
  const size_t n_local = local.size();
  for (int64_t s = 0; s < n_steps; ++s) {
    std::vector<Sample> part(std::make_move_iterator(local.begin() + n_local * s / n_steps),
                             std::make_move_iterator(local.begin() + n_local * (s + 1) / n_steps));
    auto m = trainer_->train_step(part);
    std::move(part.begin(), part.end(), local.begin() + n_local * s / n_steps);
    for (const auto& [k, v] : m) {
      sums[k] += v / double(n_steps);
      // slime logs every optimizer step: train_step/<i>/<name> for train/<name>, i = 0..n_steps-1.
      if (k.rfind("train/", 0) == 0) step_metrics_[fmt::format("train_step/{}/{}", s, k.substr(6))] = v;
    }
  }
  for (const auto& [k, v] : sums) step_metrics_[k] = v;
  step_metrics_["train/optimizer_steps"] = double(n_steps);
  step_metrics_["perf/train_rss_mb"] = double(resident_bytes()) / double(1 << 20);  // after the optimizer steps
}

void Driver::record(int64_t) {
  // rollouts.h5: every generated sample of the trained batch. First the trained ones,
  // each trainer appending its share with what training used (trainer order = training
  // order); then the router's filtered and surplus groups. One collective append.
  // The side that finishes first (one_step_off: either) waits asleep, not spinning
  // inside the HDF5 collectives on cores the other side needs.
  static const std::string waiting_for_training =
      overlapped_ ? "[record] waiting for the other side (training, or the next batch's rollout)"
                  : "[record] rollout ranks waiting for the trainers";
  static const std::string waiting_for_pause = "[record] trainers waiting for the engines to pause";
  if (full_async_) {
    // The trainers' barrier is the signal that pauses the generation (rollout ranks
    // entered it in the rollout phase); the second one waits for the pause.
    if (!trainers_done_posted_) idle_barrier(ctx_.world->world(), waiting_for_training);
    trainers_done_posted_ = false;
    Stopwatch pause_clock;
    idle_barrier(ctx_.world->world(), waiting_for_pause);
    if (trainer_) step_metrics_["perf/async_pause_wait_s"] = pause_clock.seconds();
  } else if (rl_) {
    idle_barrier(ctx_.world->world(), waiting_for_training);
  }
  // A write that fails on one rank (a full disk) stops every rank here, cleanly.
  run_on_all_and_agree(ctx_.world->world(), "[record] writing " + rollouts_->path(), [&] {
    rollouts_->append(step_->batch, batch_to_train().unused);
    rollouts_->flush();
  });
  if (!overlapped_) return;
  if (full_async_) {  // the next buffer phase takes a new batch from the queue
    *pending_ = RolloutBatch();
    pending_ready_ = false;
  } else {  // the batch generated this step is the next step's
    *pending_ = std::move(step_->generated);
    pending_ready_ = generates_next_batch();
  }
  // Every rank follows the rollout ranks' prompt cursor (the checkpoint records it).
  int64_t cursor = prompt_source_->cursor();
  static const std::string cursor_context = "[record] the router's prompt cursor";
  WaitGuard guard({&cursor_context, "MPI_Bcast", 1, "i64", router_world_rank_});
  MPI_Bcast(&cursor, 1, MPI_INT64_T, router_world_rank_, ctx_.world->world());
  prompt_source_->set_cursor(cursor);
}

void Driver::weight_sync(int64_t step) {
  // one_step_off: before generating step k+1's batch, the engines get step k's weights
  // (at step 0 they hold them: the seeded init or model.init_from; a resumed job pushes
  // them again, as the straight run does); otherwise the weights after step k, at its end.
  if (!overlapped_) push_weights(step + 1);
  else if (step > 0) push_weights(step);
}

void Driver::push_weights(int64_t version) {
  if (ctx_.world->layout().placement == Placement::Colocate) {
    // The engines run the trainer's model, or a bf16 copy of it refreshed here.
    if (engine_model_ && expert_groups_) gather_whole_model(*policy_, engine_model_.get());
    else if (engine_model_ && policy_) engine_model_->copy_weights_from(*policy_);
    if (rollout_side_) rollout_side_->set_weight_version(version);
    return;
  }
  // Expert parallelism: trainer rank 0 pushes the whole policy, its group's shards gathered.
  if (expert_groups_ && expert_groups_->group_index() == 0) {
    if (ctx_.world->rank() == 0 && !whole_policy_)
      whole_policy_ = std::make_unique<Transformer>(policy_->config(), run_seed(ctx_.deck), policy_->device());
    gather_whole_model(*policy_, whole_policy_.get(), /*to_all=*/false);  // to trainer rank 0
  }
  // The engines already waited for the trainers (asleep) in the record phase's barrier.
  if (!weight_sync_) return;
  // The weights in the engines' dtype: the sender's rounded from its masters when they
  // differ (bf16), the engines' own tensors to receive into.
  const WeightImage image = weight_image(whole_policy_ ? *whole_policy_ : policy_ ? *policy_ : *engine_model_,
                                         engine_weight_dtype_);
  int64_t v = version;
  const bool check = ctx_.deck.get_bool("rollout.check_weight_update");
  WeightSyncStats s = weight_sync_->sync(image.params, &v, check, image.flat);
  if (check) {
    uint64_t trainer_sum = s.checksum;
    static const std::string context = "[weight_sync] the trainer's checksum";
    WaitGuard guard({&context, "MPI_Bcast", 1, "u64", 0});
    MPI_Bcast(&trainer_sum, 1, MPI_UINT64_T, 0, ctx_.world->sync());
    SLIMPI_CHECK(trainer_sum == s.checksum, "weight update {} arrived corrupted: checksum {:016x}, trainer's {:016x}",
                 v, s.checksum, trainer_sum);
  }
  if (async_) async_->update_weights(v);  // between engine iterations; rollout.partial applies
  else if (rollout_side_) rollout_side_->set_weight_version(v);
  if (rank_in(ctx_.world->sync()) == 0) {
    step_metrics_["perf/weight_sync_bytes"] = double(s.bytes);
    step_metrics_["perf/weight_sync_gbps"] = double(s.bytes) / s.seconds / 1e9;
  }
}

void Driver::metrics(int64_t step) {
  // Per-rank phase times as rows of /ranks; their max over ranks as the step's perf/*.
  // (The metrics and checkpoint phases of a step come after its row is written.)
  std::map<std::string, double> mine = phase_times_;
  mine["time/step_s"] = step_clock_.seconds();
  log_metrics([&] { metrics_->log_ranks(step, mine); });
  std::vector<double> local, max_over_ranks(mine.size());
  for (const auto& [k, v] : mine) local.push_back(v);
  static const std::string reduce_context = "[metrics] phase times, max over ranks";
  WaitGuard guard({&reduce_context, "MPI_Reduce", local.size(), "f64", 0});
  MPI_Reduce(local.data(), max_over_ranks.data(), static_cast<int>(local.size()), MPI_DOUBLE, MPI_MAX, 0,
             ctx_.world->world());
  std::map<std::string, double> row = step_metrics_;
  size_t i = 0;
  for (const auto& [k, v] : mine) {
    std::string phase = k.substr(5, k.size() - 7);  // "time/buffer_s" -> "buffer"
    row["perf/" + phase + "_time"] = max_over_ranks[i++];
  }
  // The share of the step (so far) that trainer rank 0 (world rank 0) does not spend
  // training or syncing, and that the router does not spend generating or scoring.
  double router_busy = generation_s_ + phase_times_["time/reward_s"];
  router_busy = rl_ ? std::min(1.0, router_busy / mine["time/step_s"]) : 0.0;
  {
    static const std::string context = "[metrics] the router's busy share";
    WaitGuard guard({&context, "MPI_Bcast", 1, "f64", router_world_rank_});
    MPI_Bcast(&router_busy, 1, MPI_DOUBLE, router_world_rank_, ctx_.world->world());
  }
  if (ctx_.world->rank() == 0 && trainer_) {
    const double busy = phase_times_["time/train_s"] + phase_times_["time/weight_sync_s"];
    row["perf/trainer_idle_fraction"] = std::max(0.0, 1.0 - busy / mine["time/step_s"]);
    if (rl_) row["perf/rollout_idle_fraction"] = 1.0 - router_busy;
  }
  log_metrics([&] { metrics_->log_step(step, row); });
  std::string text;
  auto add = [&](const char* key, const char* label, const char* format) {
    if (row.count(key)) text += fmt::format(fmt::runtime(std::string("  ") + label + " " + format), row.at(key));
  };
  add("train/loss", "loss", "{:.4f}");
  add("rollout/raw_reward", "reward", "{:.3f}");
  add("eval/pass@1", "eval_pass@1", "{:.3f}");
  add("rollout/response_len/mean", "resp_len", "{:.1f}");
  add("train/grad_norm", "grad_norm", "{:.3f}");
  log::info("step {}/{}  {:.3f} s{}", step + 1, ctx_.deck.get_int("run.n_steps"), row["perf/step_time"], text);
}

}  // namespace slimpi
