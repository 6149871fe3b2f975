#include "train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>

#include <cmath>

#include "core/timer.h"
#include "parallel/comm_tensor.h"
#include "model/log_probs.h"
#include "train/advantages.h"
#include "train/expert_parallel.h"
#include "train/gae.h"
#include "train/gradient_groups.h"
#include "train/loss/loss_term.h"
#include "train/teacher_scores.h"
#include "model/head_log_probs.h"
#include "model/head_top_k.h"
#include "train/metric_sums.h"
#include "train/micro_batches.h"
#include "train/moe_terms.h"
#include "train/mtp_loss.h"
#include "train/packed_batch.h"
#include "train/pipeline_schedule.h"
#include "train/policy_loss.h"
#include "train/rl_objective.h"
#include "train/whitening.h"
#include "arch/mtp_names.h"

namespace slimpi {

namespace {

// The parameters the optimizer updates: all, or all but the MTP layers' (a frozen draft).
std::vector<NamedTensor> trainable(const Transformer& policy, bool with_mtp) {
  std::vector<NamedTensor> out;
  for (const auto& p : policy.parameters())
    if (with_mtp || !is_mtp_parameter(p.name)) out.push_back(p);
  return out;
}

// The parameters of one kind, without the last pipeline stage's copy of the embedding (a
// buffer of its own, outside the norm).
std::vector<NamedTensor> gradient_group(const Transformer& policy, GradientGroup group, bool mtp) {
  std::vector<NamedTensor> out;
  const bool copy = last_stage_copies_embedding(policy.config());
  for (const auto& p : policy.parameters())
    if (group_of(policy, p.name) == group && is_mtp_parameter(p.name) == mtp &&
        !policy.pipeline_shard().is_embedding_copy(p.name, copy))
      out.push_back(p);
  return out;
}

// x summed over `comm` (null: x).
double summed(double x, Comm* comm) {
  if (!comm) return x;
  at::Tensor t = at::full({1}, x, at::kDouble);
  allreduce(*comm, t);
  return t.item<double>();
}

// Gradient buckets split into equal chunks over the distributed optimizer's group.
int64_t padding(const TrainerConfig& cfg, Comm* group) {
  return cfg.distributed_optimizer && group ? group->size() : 1;
}

// A one-token forward for a rank with no micro-batch left while its expert group still
// runs some: it meets the others' token exchanges and contributes nothing. with_mtp: the
// MTP depths run after the trunk, on its detached output, as the MTP loss runs them (MoE
// depths exchange tokens too); every output enters the zero so that the backward meets
// the exchanges' backward in the order a real micro-batch's does (train/mtp_loss.cpp
// likewise keeps a depth with no counted row in the graph).
at::Tensor idle_forward(const Transformer& model, Precision precision, bool with_mtp = false) {
  ForwardPrecision scope(precision, model.device());
  const at::Tensor token = at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(model.device()));
  if (!with_mtp) return model.forward_packed(token, {1}).sum() * 0.0;
  return idle_trunk_and_mtp(model, model.forward_packed_hidden(token, {1}));
}

}  // namespace

at::Tensor idle_trunk_and_mtp(const Transformer& model, const at::Tensor& hidden) {
  const at::Tensor token = at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(model.device()));
  at::Tensor zero = hidden.sum() * 0.0;
  at::Tensor in = hidden.detach();
  for (int64_t i = 0; i < model.n_mtp_layers(); ++i) {
    in = model.forward_mtp_packed(i, in, token, {1});
    zero = zero + in.sum() * 0.0;
  }
  return zero;
}

Trainer::Trainer(const TrainerConfig& cfg, Transformer& policy, Comm* dp, const Transformer* reference,
                 Comm* expert_replicas, Comm* replicas)
    : cfg_(cfg),
      policy_(policy),
      dp_(dp),
      replicas_(replicas ? replicas : dp),
      reference_(reference),
      expert_group_(policy.expert_shard().size > 1 ? policy.expert_shard().comm : nullptr),
      expert_replicas_(expert_replicas),
      tensor_group_(policy.tensor_shard().size > 1 ? policy.tensor_shard().comm : nullptr),
      pipeline_(policy.pipeline_shard()),
      train_mtp_(policy.n_mtp_layers() > 0 && cfg.mtp_loss_coef > 0),
      optimizer_(cfg.distributed_optimizer ? nullptr : std::make_unique<AdamW>(trainable(policy, train_mtp_), cfg.adam)),
      moe_(policy.config().n_experts > 0),
      moe_layers_(moe_layer_indices(policy.config())) {
  for (int64_t l : moe_layers_) {
    if (l < pipeline_.first_layer) ++stage_first_moe_;
    else if (pipeline_.holds_layer(l, policy.config().n_layers)) stage_moe_layers_.push_back(l);
  }
  loss_terms_ = build_loss_terms(cfg_, policy_);  // over this Trainer's own config (the terms keep a reference)
  SLIMPI_CHECK(!(needs_reference(cfg_) && !reference_), "the KL loss and the reward-side KL need a reference model");
  SLIMPI_CHECK(!expert_group_ || !reference_ || reference_->expert_shard().comm == expert_group_,
               "the reference model must be sharded over the policy's expert group");
  SLIMPI_CHECK(!tensor_group_ || !reference_ || reference_->tensor_shard().comm == tensor_group_,
               "the reference model must be split over the policy's tensor group");
  SLIMPI_CHECK(!reference_ || reference_->context_shard().comm == policy.context_shard().comm,
               "the reference model must be split over the policy's context group");
  policy_.set_recompute(cfg_.recompute);
  // The gradient buffers, one per kind of parameter (train/gradient_groups.h), in one
  // order on every rank (their non-blocking reductions are started in it): the trunk's,
  // then the MTP layers' by the same kinds.
  const double kv_replicas = double(kv_head_replicas(policy.config(), policy.tensor_shard().size));
  for (const bool mtp : {false, true}) {
    if (mtp && !train_mtp_) continue;  // a frozen draft: no gradient, no update
    for (const auto& [kind, reduce_over, norm_over, replicas] :
         {std::tuple{GradientGroup::Replicated, replicas_, (Comm*)nullptr, 1.0},
          std::tuple{GradientGroup::TensorSplit, replicas_, tensor_group_, 1.0},
          std::tuple{GradientGroup::KvReplicas, replicas_, tensor_group_, kv_replicas},
          std::tuple{GradientGroup::Experts, expert_replicas_, expert_group_, 1.0}}) {
      std::vector<NamedTensor> params = gradient_group(policy, kind, mtp);
      if (params.empty()) continue;
      GradGroup g;
      g.grads = std::make_unique<GradBuffer>(params, cfg.grad_bucket_bytes, padding(cfg, reduce_over));
      g.reduce_over = reduce_over;
      g.norm_over = norm_over;
      g.norm_replicas = replicas;
      g.mtp = mtp;
      g.experts = kind == GradientGroup::Experts;
      if (cfg.distributed_optimizer) g.sharded = std::make_unique<DistributedAdamW>(*g.grads, reduce_over, cfg.adam);
      groups_.push_back(std::move(g));
    }
  }
  // Pipeline parallelism: the last stage's copy of the embedding in a buffer of its own,
  // reduced as the replicated ones and clipped by the same norm, counted on the first stage.
  std::vector<NamedTensor> copy;  // (replicated, or vocabulary-split under tensor parallelism)
  for (const auto& p : policy.parameters())
    if (pipeline_.is_embedding_copy(p.name, last_stage_copies_embedding(policy.config()))) copy.push_back(p);
  if (!copy.empty()) {
    GradGroup g;
    g.grads = std::make_unique<GradBuffer>(copy, cfg.grad_bucket_bytes, padding(cfg, replicas_));
    g.reduce_over = replicas_;
    g.in_norm = false;
    if (cfg.distributed_optimizer) g.sharded = std::make_unique<DistributedAdamW>(*g.grads, replicas_, cfg.adam);
    groups_.push_back(std::move(g));
  }
  SLIMPI_CHECK(!groups_.empty() && !groups_.front().mtp && !groups_.front().experts,
               "the policy has no replicated parameter (its norms, at least)");
  SLIMPI_CHECK(!reference_ || reference_->pipeline_shard().stage == pipeline_.stage,
               "the reference model must be split over the policy's pipeline stages");
  if (cfg_.mode == "rl" && cfg_.estimator->needs_critic)
    critic_ = std::make_unique<Critic>(cfg_, policy_, dp_, cfg_.critic.seed, replicas_);
}

const GradBuffer* Trainer::expert_grads() const {
  for (const auto& g : groups_)
    if (g.experts && !g.mtp) return g.grads.get();
  return nullptr;
}

int64_t Trainer::aligned_micro_batches(int64_t n) const {
  if (!expert_group_) return n;
  at::Tensor t = at::full({1}, n, at::kLong);
  // Under context parallelism an expert group may hold part of a context group, whose
  // ranks must run as many forwards (their attention gathers over it): the most over every
  // replica, a group that contains both.
  allreduce(policy_.context_shard().size > 1 ? *replicas_ : *expert_group_, t, ReduceOp::Max);
  return t.item<int64_t>();
}

double Trainer::grad_norm(bool mtp) const {
  // Every parameter counted once: the replicated ones on this rank (every rank of its
  // tensor group holds the same sums), the tensor group's splits and the expert group's
  // shards added up over their groups (the replicas of a shard hold the same sums), the
  // replicated key/value heads added up over the tensor group and divided by their
  // number of replicas (each replica holds the same sums).
  // The distributed optimizer holds each sum in chunks over the buffer's group.
  // Pipeline parallelism: every stage's parameters, added up over the stages (the
  // embedding's copy on the last stage not counted).
  double sq = 0;
  for (const auto& g : groups_) {
    if (g.mtp != mtp || !g.in_norm) continue;
    const double mine = g.sharded ? summed(g.sharded->local_norm_sq(), g.reduce_over) : std::pow(g.grads->global_norm(), 2);
    sq += summed(mine, g.norm_over) / g.norm_replicas;
  }
  if (pipeline_.size > 1) sq = summed(sq, pipeline_.comm);
  return std::sqrt(sq);
}

bool Trainer::needs_reference(const TrainerConfig& cfg) {
  return cfg.mode == "rl" && (cfg.use_kl_loss || cfg.kl_coef != 0.0);
}

std::vector<std::vector<float>> Trainer::response_log_probs(const std::vector<Sample>& samples,
                                                            const Transformer& model, bool replay) const {
  at::NoGradGuard no_grad;
  std::vector<int64_t> lengths;
  for (const auto& s : samples) lengths.push_back(s.packed_length());
  const auto plan = plan_micro_batches(lengths, cfg_.n_micro_batches, cfg_.max_tokens_per_micro_batch);
  const int64_t n_runs = aligned_micro_batches(int64_t(plan.size()));  // expert parallelism: the group's
  if (pipeline_.size == 1)
    for (int64_t i = int64_t(plan.size()); i < n_runs; ++i)
      idle_forward(model, cfg_.precision);  // expert parallelism: meet the group's exchanges
  std::vector<std::vector<float>> out(samples.size());
  const std::vector<at::Tensor> staged = pipeline_.size > 1 ? pipelined_log_probs(samples, plan, model, replay, n_runs)
                                                            : std::vector<at::Tensor>{};
  for (size_t micro = 0; micro < plan.size(); ++micro) {
    const std::vector<int64_t>& which = plan[micro];
    at::Tensor logp;  // [N]
    if (pipeline_.size > 1) {
      logp = staged[micro];
    } else {
      PackedBatch b = pack(samples, which, model.device());
      MoeTrace trace;  // train.routing_replay: the rollout's experts in every trainer forward
      if (replay) trace.replay = packed_routing(samples, which, model.config(), model.device(), true);
      logp = packed_log_probs(model, b, cfg_.precision, cfg_.temperature, false, replay ? &trace : nullptr).logp;
    }
    logp = logp.cpu().contiguous();
    int64_t start = 0;
    for (int64_t i : which) {
      const int64_t n = samples[i].response_length();
      const float* p = logp.data_ptr<float>() + start;
      out[size_t(i)].assign(p, p + n);
      start += n;
    }
  }
  return out;
}

// A step: counts → declared metrics → per micro-batch forward, objective, backward →
// gradient reduction → clip and AdamW.
std::map<std::string, double> Trainer::train_step(std::vector<Sample>& local) {
  Stopwatch clock;
  const StepInputs in = step_inputs(local);
  // An optimizer step whose share is empty on every rank (a rollout of very few
  // samples cut into num_steps_per_rollout parts rank by rank) changes nothing.
  if (in.n_samples == 0) return {{"train/optimizer_step_empty", 1.0}};
  for (auto& g : groups_) g.grads->zero();
  MetricSums sums = declare_step_metrics();
  forwards_and_backwards(local, in, sums);
  if (pipeline_.size > 1) sum_tied_embedding_grads();
  reduce_gradients();
  std::map<std::string, double> metrics = sums.reduce(dp_);
  // Pipeline parallelism: the loss terms ran on the last stage alone (the others' sums are
  // 0); an MoE model's routing metrics and router losses are each stage's own layers'.
  if (pipeline_.size > 1) sum_over_stages(pipeline_, metrics);
  if (moe_) finish_routing_metrics(moe_layers_, metrics);
  apply_update(metrics);
  const double seconds = clock.seconds();
  metrics["perf/actor_train_time"] = seconds;
  metrics["perf/train_tokens_per_s"] = in.n_tokens / seconds;
  return metrics;
}

Trainer::StepInputs Trainer::step_inputs(const std::vector<Sample>& local) const {
  const at::Device device = policy_.device();
  StepInputs in;
  const int64_t k = train_mtp_ ? policy_.n_mtp_layers() : 0;
  std::vector<double> local_counts(size_t(3 + k), 0.0);  // samples, masked tokens, all tokens, MTP positions per depth
  for (const auto& s : local) {
    in.masks.push_back(per_token_tensor(s.loss_mask, s.response_length(), 1.0f, device));
    if (cfg_.mode == "rl") in.advantages.push_back(per_token_tensor(s.advantages, s.response_length(), 0.0f, device));
    local_counts[0] += 1;
    local_counts[1] += mask_sum(s);
    local_counts[2] += static_cast<double>(s.packed_length());
    SLIMPI_CHECK(k == 0 || s.context_starts.empty(),
                 "sample (step {}, group {}, index {}) is a trajectory split into {} contexts (its environment's "
                 "new_context), which the MTP loss does not cover yet: set train.mtp_loss_coef = 0 with this "
                 "environment", s.step, s.group_index, s.index, s.context_starts.size() + 1);
    for (int64_t i = 0; i < k; ++i)
      local_counts[size_t(3 + i)] += mtp_counted_positions(s.prompt_length, int64_t(s.tokens.size()), s.loss_mask, i);
  }
  at::Tensor counts = at::tensor(local_counts, at::kDouble);  // [3 + k]
  if (dp_) allreduce(*dp_, counts);
  const double* totals = counts.data_ptr<double>();
  in.n_samples = totals[0];
  in.n_masked = totals[1];
  in.n_tokens = totals[2];
  in.n_mtp.assign(totals + 3, totals + 3 + k);
  return in;
}

MetricSums Trainer::declare_step_metrics() const {
  // Every metric a step can log, declared up front: the list reduced over dp must be
  // the same on every rank, including a rank that holds no sample this step.
  MetricSums sums;
  for (const auto& term : loss_terms_) term->declare_metrics(sums);
  return sums;
}

bool Trainer::overlaps_grad_reduce() const {
  // The same on every rank: non-blocking and blocking collectives do not match.
  // With expert parallelism on NCCL, backward itself waits on other ranks (each token
  // exchange synchronises the stream), so a reduction enqueued mid-backward could wait
  // on a replica that waits on this rank: there the reductions follow backward (not
  // yet run on a GPU; on the CPU, MPI's non-blocking reductions never block backward).
  const bool cpu = policy_.device().is_cpu();
  // (Pipeline parallelism: the tied embedding's copies are summed before the reduction.)
  return cfg_.overlap_grad_reduce && pipeline_.size == 1 && replicas_ && (cpu || replicas_->device_memory()) &&
         !(expert_group_ && replicas_->device_memory());
}

void Trainer::arm_overlapped_reduction() {
  // The trunk's buffers only: every rank's backward reaches every trunk parameter, in one
  // order, so their non-blocking reductions start in one order everywhere. The MTP
  // layers' may get no gradient on a rank (no counted position in its last micro-batch)
  // and their hooks would then start later there: they are reduced after backward.
  for (auto& g : groups_) {
    if (g.mtp) continue;
    if (g.sharded) g.sharded->start_overlapped_reduce_scatter();  // the distributed optimizer: into its chunks
    else g.grads->start_overlapped_reduction(g.reduce_over);
  }
}

void Trainer::forwards_and_backwards(std::vector<Sample>& local, const StepInputs& in, MetricSums& sums) {
  std::vector<int64_t> lengths;
  for (const auto& s : local) lengths.push_back(s.packed_length());
  const auto plan = plan_micro_batches(lengths, cfg_.n_micro_batches, cfg_.max_tokens_per_micro_batch);
  if (pipeline_.size > 1) return pipelined_forwards_and_backwards(local, plan, in, sums);
  // The last backward of the step reduces gradient buckets as it produces them. With
  // MPI that needs the hooks on this thread (CPU autograd runs here; CUDA autograd
  // runs in its own threads, where only NCCL may be called).
  const bool overlap = overlaps_grad_reduce();
  const int64_t n_runs = aligned_micro_batches(int64_t(plan.size()));
  for (int64_t micro = 0; micro < n_runs; ++micro) {
    // Expert parallelism: past its own micro-batches a rank runs idle forwards while its
    // group still runs some, each with its backward, in a real micro-batch's order: the
    // token exchanges of the group's ranks pair up by call order.
    at::Tensor loss = micro < int64_t(plan.size())
                          ? micro_batch_loss(local, plan[micro], in, sums)
                          : idle_forward(policy_, cfg_.precision, train_mtp_ && policy_.config().mtp_is_moe());
    if (micro + 1 == n_runs && overlap) arm_overlapped_reduction();
    loss.backward();
  }
  for (const auto& g : groups_)
    SLIMPI_CHECK(g.grads->grads_alias_buffer(), "autograd replaced a gradient outside the flat gradient buffer");
  if (overlap && !grads().reduction_armed()) arm_overlapped_reduction();  // a rank with no micro-batch
}

at::Tensor Trainer::micro_batch_loss(std::vector<Sample>& local, const std::vector<int64_t>& which,
                                     const StepInputs& in, MetricSums& sums, const StageOutput* stage) {
  const at::Device device = policy_.device();
  const PackedBatch b = stage ? stage->batch : pack(local, which, device);
  // A pipeline's last stage: the stage's forward ran and traced its layers (the routing
  // agreement added there).
  MoeTrace own_trace;
  const MoeTrace* trace = stage ? stage->trace : moe_ ? &own_trace : nullptr;
  at::Tensor rollout_routing;  // [T, L, k] the engine's experts, -1 where none
  if (moe_ && !stage) rollout_routing = packed_routing(local, which, policy_.config(), device, cfg_.routing_replay);
  if (cfg_.routing_replay && !stage) own_trace.replay = rollout_routing;
  at::Tensor hidden;  // [T, d] the trunk's output: the MTP layers' and the top-k distillation's input
  const bool topk_distill = cfg_.mode == "rl" && cfg_.opd_topk_loss_coef > 0;
  if (stage) hidden = stage->hidden;
  const TokenLogProbs lp =
      stage ? head_token_log_probs(policy_, b, hidden, cfg_.precision, cfg_.temperature, /*with_entropy=*/true)
            : packed_log_probs(policy_, b, cfg_.precision, cfg_.temperature, /*with_entropy=*/true,
                               moe_ ? &own_trace : nullptr, train_mtp_ || topk_distill ? &hidden : nullptr);
  if (moe_ && !stage) add_routing_agreement(own_trace, rollout_routing, moe_layers_, sums);
  const ScoredMicroBatch scored = score_micro_batch(local, which, b, lp, in);
  MicroBatchView mb{local, which, b, scored, hidden, trace, stage ? stage->routing : nullptr, {}, in.n_tokens,
                    in.n_mtp};
  for (int64_t i : which) mb.masks.push_back(in.masks[i]);
  at::Tensor loss;  // the terms in order (train/loss/loss_term.h), each added to the sum so far
  for (const auto& term : loss_terms_) loss = term->add_to(loss, mb, sums);
  return loss;
}

ScoredMicroBatch Trainer::score_micro_batch(std::vector<Sample>& local, const std::vector<int64_t>& which,
                                            const PackedBatch& b, const TokenLogProbs& lp, const StepInputs& in) {
  ScoredMicroBatch scored;
  scored.logp = lp.logp;
  scored.entropy = lp.entropy;
  std::vector<at::Tensor> mask_parts, adv_parts;
  for (int64_t i : which) {
    mask_parts.push_back(in.masks[i]);
    if (cfg_.mode == "rl") adv_parts.push_back(in.advantages[i]);
  }
  scored.mask = at::cat(mask_parts);
  scored.weight = reducer_weights(local, which, b, scored.mask, in.n_samples, in.n_masked, cfg_.calculate_per_token_loss);
  if (cfg_.mode != "rl") return scored;
  const at::Device device = policy_.device();
  scored.advantages = at::cat(adv_parts);
  scored.old_logp = old_log_probs(local, which, lp.logp);
  if (!local[which[0]].rollout_log_probs.empty())
    scored.rollout_logp = gather_field(local, which, &Sample::rollout_log_probs, 0.0f, device);
  if (cfg_.use_kl_loss) scored.ref_logp = gather_field(local, which, &Sample::ref_log_probs, 0.0f, device);
  scored.sample_of_token = b.sample_of_token;
  scored.n_samples = int64_t(which.size());
  return scored;
}

at::Tensor Trainer::old_log_probs(std::vector<Sample>& local, const std::vector<int64_t>& which,
                                  const at::Tensor& logp) const {
  bool have_old = !old_from_first_step_;  // (exact on-policy: the first step's forward is the old policy's)
  for (int64_t i : which) have_old = have_old && !local[i].old_log_probs.empty();
  // Gathered either way: the gather checks every sample's vector has one entry a token.
  at::Tensor stored = gather_field(local, which, &Sample::old_log_probs, 0.0f, policy_.device());
  if (have_old) return stored;
  // One step per rollout, or the first step when the old log-probs came from the rollout:
  // this forward's policy is the old one (ρ = 1); the samples keep it (rollouts.h5
  // records it).
  at::Tensor old = logp.detach();
  at::Tensor captured = old.cpu().contiguous();
  int64_t start = 0;
  for (int64_t i : which) {
    const float* p = captured.data_ptr<float>() + start;
    local[i].old_log_probs.assign(p, p + local[i].response_length());
    start += local[i].response_length();
  }
  return old;
}

void Trainer::reduce_gradients() {
  for (auto& g : groups_) {
    if (g.sharded) g.sharded->reduce_scatter();
    else g.grads->all_reduce(g.reduce_over);
  }
}

void Trainer::apply_update(std::map<std::string, double>& metrics) {
  const double lr = cfg_.lr.at(n_steps());
  // The trunk's gradient norm, and the MTP layers' apart (each clipped on its own, so
  // that the draft's loss never scales the policy's step).
  const double grad_norm = this->grad_norm(false);
  const bool mtp = policy_.n_mtp_layers() > 0;
  const double mtp_norm = mtp ? this->grad_norm(true) : 0.0;
  // Megatron's check for NaN in loss and gradients: a non-finite step never reaches the
  // weights. Loss and norm are reduced values, the same on every dp rank.
  const double loss = metrics.count("train/loss") ? metrics["train/loss"] : 0.0;
  const bool finite = std::isfinite(grad_norm) && std::isfinite(mtp_norm) && std::isfinite(loss);
  if (finite) {
    for (auto& g : groups_) {
      const double norm = g.mtp ? mtp_norm : grad_norm;
      if (g.sharded) g.sharded->clip(norm, cfg_.clip_grad);
      else g.grads->clip(norm, cfg_.clip_grad);
    }
    if (optimizer_) {
      optimizer_->step(lr);
    } else {
      ++n_steps_;
      for (auto& g : groups_) g.sharded->step(lr, n_steps_);
    }
  } else if (!cfg_.skip_nonfinite_steps) {
    SLIMPI_FAIL_ALL("optimizer step {}: the loss is {} and the gradient norm {}{}; stopping before they reach the "
                    "weights (train.skip_nonfinite_steps = true skips such steps instead)",
                    n_steps(), loss, grad_norm, mtp ? fmt::format(" (the MTP layers' {})", mtp_norm) : "");
  }
  // Pipeline parallelism: the last stage's copy of the embedding takes the first stage's
  // values (the two took the same step, but their buffers' reductions may add in another
  // order).
  if (pipeline_.size > 1 && pipeline_.tied && last_stage_copies_embedding(policy_.config()))
    broadcast(*pipeline_.tied, policy_.parameter("model.embed_tokens.weight").detach(), 0);
  metrics["train/skipped_nonfinite_step"] = finite ? 0.0 : 1.0;
  metrics["train/grad_norm"] = grad_norm;
  if (mtp) metrics["train/mtp_grad_norm"] = mtp_norm;
  metrics["train/lr"] = lr;
}

Trainer::StateBytes Trainer::state_bytes() const {
  StateBytes b;
  for (const auto& p : policy_.parameters()) b.params += p.tensor.numel() * int64_t(p.tensor.element_size());
  for (const auto& g : groups_) {
    b.grads += g.grads->flat().numel() * int64_t(sizeof(float));
    if (g.sharded) b.optimizer += 2 * g.sharded->n_local() * int64_t(sizeof(float));
  }
  if (optimizer_)
    for (const auto& t : optimizer_->state()) b.optimizer += t.tensor.numel() * int64_t(t.tensor.element_size());
  return b;
}

}  // namespace slimpi
