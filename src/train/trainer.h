// Trainer — one data-parallel trainer rank: turns a step's samples into one optimizer
// step of the policy (docs/architecture.md, the step table; the math in docs/rl_loop.md).
//
// Owned by the driver on every trainer rank; holds the AdamW state, the flat gradient
// buffer, the LR schedule and (when the KL loss is on) a frozen reference model.
// An RL rollout, as slime's actor does it (slime's "per-rollout trainer
// pipeline"): prepare_rollout() computes the reference and old log-probs where they
// are needed, the per-token KL, the advantages of every sample (advantage-estimator
// registry, with the reward-side KL) and whitens them once over all the rollout's
// samples on all data-parallel ranks; then num_steps_per_rollout train_step() calls.
// A step: global sample/token counts (allreduce) → micro-batches (fixed count or
// first-fit by tokens), each: packed forward, response log-probs, per-token loss
// terms, reduced with step-wide weights, backward → gradient all-reduce in buckets →
// global-norm clip → AdamW. The result does not depend on how the step's samples are
// split over ranks and micro-batches (up to fp32 round-off).
// Expert parallelism (the policy an expert shard, train/expert_parallel.h): the experts'
// gradients live in a second buffer reduced over the ranks holding the same experts,
// the gradient norm adds up the group's shards, and every rank of an expert group runs
// as many forwards (and backwards) as the busiest of them — a rank out of micro-batches
// runs a one-token forward whose loss is multiplied by zero, so that the token exchanges
// of every MoE layer meet on all of them.
// Tensor parallelism (the policy a tensor shard, train/model_parallel.h): `dp` is the
// data-parallel group of this rank's tensor rank; every rank of a tensor group gets the
// same samples and runs the same micro-batches; the split parameters' gradients live in
// a third buffer, reduced over dp, their norm added up over the tensor group (key/value
// heads replicated over the group, t > Hkv, in a fourth: their replicas' sums are equal,
// so their norm is counted once per head).
// Context parallelism (the policy split over a context group, model/context_split.h): the
// ranks of a context group get the same samples, each runs its chunks of every sequence
// and computes the same loss (the per-token log-probs gathered); their gradients are
// parts, summed with the data-parallel ones over `replicas` (dp × context).
// Pipeline parallelism (the policy one stage, model/pipeline_shard.h): the micro-batches
// run a 1F1B schedule (train/trainer_pipeline.cpp): each stage runs its layers, the last
// the head and the loss; the log-prob passes run through the stages and the last stage's
// log-probs are broadcast to every stage and its metrics added up over them (an MoE
// model's routing metrics and router losses are each stage's own); the gradient norm adds
// the stages' (the embedding's copy on the last stage, tied or the MTP layers', counted once), and the two
// copies' gradients are summed before the update. With expert parallelism every pipeline
// of an expert group runs as many micro-batches (one-token idle ones past its own).
// Distributed optimizer (train.distributed_optimizer, train/distributed_optimizer.h):
// each buffer's AdamW state is sharded over the group that reduces it; its gradients
// are reduce-scattered bucket by bucket from inside the last backward (or after it,
// without train.overlap_grad_reduce) and the parameters all-gathered after the update.
#pragma once

#include <mpi.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <slimpi/sample.h>

#include "model/transformer.h"
#include "parallel/comm.h"
#include "train/adamw.h"
#include "train/critic.h"
#include "train/distributed_optimizer.h"
#include "train/grad_buffer.h"
#include "train/loss/loss_term.h"
#include "train/rl_objective.h"
#include "train/metric_sums.h"
#include "train/trainer_config.h"

namespace slimpi {

struct PackedBatch;
struct StagedRouting;
struct TokenLogProbs;

class Trainer {
 public:
  // dp: the data-parallel communicator (null = single rank). reference: frozen
  // reference policy (required when needs_reference(cfg)). expert_replicas: with an
  // expert-sharded policy, the ranks holding the same experts (ExpertGroups::replicas).
  // replicas: the ranks holding this rank's shard, over which its gradients are summed
  // and the distributed optimizer shards (ModelParallel::replicas: dp × the
  // context-parallel group, whose ranks train the same samples on their own tokens;
  // null: dp).
  Trainer(const TrainerConfig& cfg, Transformer& policy, Comm* dp, const Transformer* reference = nullptr,
          Comm* expert_replicas = nullptr, Comm* replicas = nullptr);
  Trainer(const Trainer&) = delete;  // its loss terms refer to its config
  Trainer& operator=(const Trainer&) = delete;
  // A reference model is needed for the KL loss and for the reward-side KL.
  static bool needs_reference(const TrainerConfig& cfg);

  // Fills old_log_probs (policy) or ref_log_probs (reference) of `samples`, no grad.
  void compute_log_probs(std::vector<Sample>& samples, bool reference) const;
  // Whether this rollout's old log-probs are its rollout log-probs (exact on-policy,
  // synchronous, every sample from one weight version; agreed over dp): then
  // prepare_rollout copies them instead of running the forward pass. Collective over dp.
  bool old_from_rollout(const std::vector<Sample>& samples) const;

  // RL, once per rollout, before its optimizer steps; collective over dp. Fills, per
  // sample: values (the critic's, ppo), teacher_log_probs (with a teacher), ref_log_probs (when a reference exists), old_log_probs (when
  // `recompute_old`, i.e. more than one optimizer step, or when kl_coef needs them), kl
  // (old vs reference, train.kl_loss_type, when both exist), raw_advantages (the
  // estimator on `reward`, with −kl_coef·kl) and advantages (whitened over every
  // sample of the rollout on every dp rank when normalize_advantages, else equal), returns
  // (ppo: GAE with train.lambd_value, the critic's targets).
  // Returns rollout/advantages, rollout/log_probs, rollout/ref_log_probs, rollout/kl
  // (and, ppo, train/values_mean, train/returns_mean): means over samples of each
  // sample's token mean, identical on every dp rank; ppo: train/explained_variance,
  // 1 − Var(G − V)/Var(G) over the rollout's counted tokens; with a teacher,
  // train/opd_reverse_kl, the mean over samples of each one's token mean of
  // logp_old − logp_teacher (its advantages less opd_kl_coef times it, before whitening). With
  // routing_replay_gap also train/train_rollout_logprob_abs_diff_unreplayed: |log-prob
  // without replay − rollout log-prob| under the weights that start the rollout (one
  // more forward over the rollout), weighted as the loss weighs tokens; compare it with
  // train/train_rollout_logprob_abs_diff, the same with replay.
  std::map<std::string, double> prepare_rollout(std::vector<Sample>& local, bool recompute_old);
  // A rollout's optimizer steps, after prepare_rollout (train/rollout_training.cpp): its
  // samples in n_steps consecutive parts, one train_step each. PPO's critic first (slime's
  // order), critic.n_epochs passes over the same parts; during critic.warmup_rollouts the
  // policy does not move. `step` (0-based) names the run's step in the log. Returns
  // train_step's metrics averaged over the optimizer steps, train_step/<i>/<name> for each
  // step's train/<name> (slime logs every one), the critic's, train/critic_steps and
  // train/optimizer_steps. Collective over dp.
  std::map<std::string, double> train_rollout(std::vector<Sample>& local, int64_t n_steps, int64_t step);

  // Pipeline parallelism: the seconds the last optimizer step's schedule waited for the
  // neighbouring stages on this rank (its share of the pipeline's bubble; perf/).
  double pipeline_wait_seconds() const { return pipeline_wait_s_; }
  // One optimizer step on this rank's share of the step. Collective over dp. In RL,
  // samples whose old_log_probs are empty get them from this step's forward (ρ = 1:
  // the policy before this step is the one that scored them).
  // Returns slime-named metrics (train/*, perf/*), identical on every dp rank; a step
  // with no sample on any rank does nothing and returns train/optimizer_step_empty = 1.
  std::map<std::string, double> train_step(std::vector<Sample>& local);

  int64_t n_steps() const { return optimizer_ ? optimizer_->n_steps() : n_steps_; }
  // Bytes this rank holds for the policy's parameters, its gradient buffers and the
  // optimizer's moments (what model parallelism and the distributed optimizer divide;
  // activations and temporaries not included).
  struct StateBytes {
    int64_t params = 0, grads = 0, optimizer = 0;
  };
  StateBytes state_bytes() const;
  // The gradients of the replicated parameters (all of them without model parallelism),
  // and of this rank's experts (null without expert parallelism).
  const GradBuffer& grads() const { return *groups_.front().grads; }
  const GradBuffer* expert_grads() const;
  const TrainerConfig& config() const { return cfg_; }
  // The value model of an estimator that needs one (ppo; null otherwise): prepare_rollout
  // fills each sample's values and returns with it; the caller trains it
  // (Critic::train_step) before the policy's steps, as slime does.
  Critic* critic() { return critic_.get(); }
  // On-policy distillation (train.opd_kl_coef > 0) with teacher.placement = "trainer": the
  // frozen teacher whose log-probs prepare_rollout takes (driver/teacher_model.h builds
  // it; not owned). With "rollout" there is none here: the samples arrive scored.
  void set_teacher(const Transformer* teacher) { teacher_ = teacher; }

  // Model, optimizer state, step count and the torch CPU RNG state in one HDF5 file,
  // every tensor whole under the whole model's name (train/trainer_checkpoint.cpp).
  // Collective over `trainer`, the communicator of every trainer rank: the file is
  // parallel and each rank writes only its own part (io/tensor_pieces.h), of the tensors
  // it is the first to hold (stores_part) and of its distributed optimizer's chunks; no
  // rank gathers anything. MPI_COMM_NULL: a serial file, for a trainer that holds the
  // whole state (no model parallelism or distributed optimizer: data-parallel rank 0
  // alone may call). A write that fails on any rank removes the file; that rank throws.
  void save(const std::string& path, MPI_Comm trainer = MPI_COMM_NULL) const;
  // Each rank reads its parts of the file (its experts, tensor-parallel parts and
  // moment chunks), whatever layout wrote it.
  void load(const std::string& path);

 private:
  TrainerConfig cfg_;
  Transformer& policy_;
  Comm* dp_;
  Comm* replicas_;  // gradients are summed over it (dp_ without context parallelism)
  const Transformer* reference_;
  // Forwards the ranks of this rank's expert group run together for `n` of its own
  // micro-batches (n without expert parallelism).
  int64_t aligned_micro_batches(int64_t n) const;
  // Each sample's response log-probs under `model`, no grad, with or without replaying
  // its routing trace; collective over the expert group.
  std::vector<std::vector<float>> response_log_probs(const std::vector<Sample>& samples, const Transformer& model,
                                                     bool replay) const;

  // prepare_rollout's steps, in order (train/rollout_preparation.cpp).
  void score_rollout(std::vector<Sample>& local, bool with_old);  // log-probs, values, teacher
  MetricSums declare_rollout_metrics(bool with_old) const;
  // One sample's KL, advantages [R] before whitening (distillation's term included) and
  // critic targets; adds its metric terms.
  at::Tensor score_sample(Sample& s, const at::Tensor& mask, const at::Tensor& per_sample, bool with_old,
                          MetricSums& sums);
  void add_critic_targets(Sample& s, const AdvantageInputs& in, const at::Tensor& per_sample, MetricSums& sums) const;
  void add_replay_gap(const Sample& s, const std::vector<float>& unreplayed, const at::Tensor& mask,
                      const at::Tensor& per_sample, MetricSums& sums) const;
  std::map<std::string, double> rollout_metrics(std::map<std::string, double> totals) const;

  // The steps of train_step, in order.
  struct StepInputs {
    std::vector<at::Tensor> masks, advantages;  // per local sample, [R_i] on the model's device (advantages: RL)
    double n_samples = 0, n_masked = 0, n_tokens = 0;  // over every dp rank: the reducer's denominators
    std::vector<double> n_mtp;  // per MTP depth: its counted positions over every dp rank (train/mtp_loss.h)
  };
  StepInputs step_inputs(const std::vector<Sample>& local) const;  // collective over dp
  MetricSums declare_step_metrics() const;
  // Every micro-batch's forward, objective and backward (idle ones too, with expert
  // parallelism); the last backward starts the gradient reduction when it overlaps.
  void forwards_and_backwards(std::vector<Sample>& local, const StepInputs& in, MetricSums& sums);
  // stage: a pipeline's last stage passes its batch and its stage's output (the trunk's
  // final-norm output); otherwise the whole forward runs here.
  struct StageOutput {
    const PackedBatch& batch;
    at::Tensor hidden;
    const MoeTrace* trace = nullptr;          // MoE: the last stage's layers' routing
    const StagedRouting* routing = nullptr;   // MoE: every stage's choice counts
  };
  at::Tensor micro_batch_loss(std::vector<Sample>& local, const std::vector<int64_t>& which, const StepInputs& in,
                              MetricSums& sums, const StageOutput* stage = nullptr);
  // Pipeline parallelism (train/trainer_pipeline.cpp): the step's micro-batches through
  // the stages, 1F1B; the log-prob pass of `model` through them (each stage forwards every
  // micro-batch in turn; `replay`: the samples' routing traces; n_runs: the expert group's
  // count of micro-batches, idle ones past the plan's), every stage returning the last
  // stage's [N] log-probs of each planned micro-batch; the embedding's two copies'
  // gradients summed.
  void pipelined_forwards_and_backwards(std::vector<Sample>& local, const std::vector<std::vector<int64_t>>& plan,
                                        const StepInputs& in, MetricSums& sums);
  std::vector<at::Tensor> pipelined_log_probs(const std::vector<Sample>& samples,
                                              const std::vector<std::vector<int64_t>>& plan, const Transformer& model,
                                              bool replay, int64_t n_runs) const;
  void sum_tied_embedding_grads();
  double pipeline_wait_s_ = 0;  // the last step's waits for the neighbouring stages
  // The micro-batch's tokens as the loss terms read them: log-probs, entropy, mask and
  // reducer weights; RL: advantages, old, rollout and reference log-probs.
  ScoredMicroBatch score_micro_batch(std::vector<Sample>& local, const std::vector<int64_t>& which,
                                     const PackedBatch& b, const TokenLogProbs& lp, const StepInputs& in);
  // [N] the micro-batch's old log-probs: the samples' own, or (none yet: one optimizer
  // step per rollout) this forward's `logp`, detached and stored in the samples.
  at::Tensor old_log_probs(std::vector<Sample>& local, const std::vector<int64_t>& which,
                           const at::Tensor& logp) const;
  // The gradients summed over dp (and expert replicas).
  void reduce_gradients();
  // The global norm of the trunk's gradients (mtp false) or of the MTP layers'.
  double grad_norm(bool mtp) const;
  // Clip (the trunk and the MTP layers each by its own norm) and AdamW unless the loss or
  // a norm is non-finite; adds train/grad_norm, train/mtp_grad_norm, lr, skips.
  void apply_update(std::map<std::string, double>& metrics);
  bool overlaps_grad_reduce() const;
  void arm_overlapped_reduction();

  bool said_old_from_rollout_ = false;  // the log line of old_from_rollout, once a run
  // Set when prepare_rollout took the old log-probs from the rollout: the rollout's first
  // optimizer step replaces them with its own forward's (the trainer's numbers under the
  // rollout's weights, bits equal to the engine's), so that
  // train/train_rollout_logprob_abs_diff compares the trainer with the engine, not the
  // rollout with itself. Cleared after that step.
  bool old_from_first_step_ = false;
  Comm* expert_group_ = nullptr;     // the policy's expert-parallel group (null: no expert parallelism)
  Comm* expert_replicas_ = nullptr;  // ranks holding this rank's experts
  Comm* tensor_group_ = nullptr;     // the policy's tensor-parallel group (null: no tensor parallelism)
  PipelineShard pipeline_;           // the policy's stage (size 1: no pipeline)
  bool train_mtp_ = false;           // the policy has MTP layers and train.mtp_loss_coef > 0
  // AdamW on every parameter, or (train.distributed_optimizer) one DistributedAdamW per
  // gradient buffer, sharded over the group that reduces it.
  std::unique_ptr<AdamW> optimizer_;
  int64_t n_steps_ = 0;  // the distributed optimizer's step count
  // One gradient buffer: the parameters of one kind (replicated over the tensor group,
  // split over it, key/value heads replicated within it, one expert shard's; the trunk's
  // or the MTP layers'), the group its sums run over, the group its norm adds up over and
  // how many replicas there count each element, and its distributed optimizer.
  struct GradGroup {
    std::unique_ptr<GradBuffer> grads;
    Comm* reduce_over = nullptr;
    Comm* norm_over = nullptr;
    double norm_replicas = 1;
    bool mtp = false, experts = false;
    bool in_norm = true;  // false: the last pipeline stage's copy of the embedding (counted on the first)
    std::unique_ptr<DistributedAdamW> sharded;  // train.distributed_optimizer
  };
  std::vector<GradGroup> groups_;  // the trunk's replicated parameters first; one order on every rank
  // Whether this rank writes its part of stored tensor `name` (a parameter, or its
  // moment without the distributed optimizer) to checkpoints: the first of the ranks
  // holding the same part does.
  bool stores_part(const std::string& name) const;
  // Whether this rank is the first of its tensor group to hold its part of parameter
  // `param` (tensor rank 0 for a replicated one).
  bool first_in_tensor_group(const std::string& param) const;
  LossTerms loss_terms_;  // the micro-batch loss's terms, in order (train/loss/loss_term.h)
  std::unique_ptr<Critic> critic_;  // ppo's value model
  const Transformer* teacher_ = nullptr;  // on-policy distillation's
  bool moe_ = false;                // model.n_experts > 0
  std::vector<int64_t> moe_layers_;  // the model layer of each MoE layer
  // Pipeline parallelism: the model's index of this stage's first MoE layer, and the model
  // layers of its MoE layers (every MoE layer at one stage).
  int64_t stage_first_moe_ = 0;
  std::vector<int64_t> stage_moe_layers_;
};

// An idle forward's loss (expert parallelism, train/trainer.cpp): zero times the trunk's
// output `hidden` [1, d] of the one token 0 and of the MTP depths run on it detached, as
// the MTP loss runs them, so that its backward meets the MoE depths' token exchanges.
// Call it in the forward's precision scope (the exchanged rows' dtype must be a real
// micro-batch's).
at::Tensor idle_trunk_and_mtp(const Transformer& model, const at::Tensor& hidden);

}  // namespace slimpi
