// Critic — the value model of PPO (train.advantage_estimator = "ppo"; docs/rl_loop.md):
// the policy's architecture without MTP layers, whose LM head is replaced by a value head
// (one output per position: V = h·w + b on the final norm's output h), trained with the
// clipped value loss (train/value_loss.h) by its own AdamW, learning-rate schedule and
// gradient clip ([critic] in the deck).
//
// Owned by the Trainer on every trainer rank, laid out as the policy: split over its tensor
// group (the value head, like the norms, whole on every rank of it), a replica on every
// data-parallel rank, its gradients summed over the data-parallel group in one buffer per
// kind of parameter (train/gradient_groups.h). Not expert-parallel (refused).
// Under tensor parallelism every rank of a group computes the same values and loss; the
// trunk's output enters the head with its gradient divided by the group's size, since the
// trunk's backward sums the ranks' gradients of it (copy_to_tp / gather_from_sequence).
// V_t of response token t is the head at the position whose logits score t (the
// position before it), as slime's get_values takes it. Invariant: every data-parallel
// rank holds the same critic weights and moments (same start, same summed gradients).
// The trunk's LM head (untied models) is never read: it is left out of the optimizer
// and of checkpoints.
// Under pipeline parallelism the trunk is split into the policy's stages and the value
// head lives on the last (the tied embedding's copy there is never read: left out too);
// its steps run the 1F1B schedule (train/pipeline_schedule.h), the value loss on the last
// stage, whose values and metrics every stage gets; the gradient norm adds the stages'.
#pragma once

#include <mpi.h>

#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <slimpi/sample.h>

#include "model/transformer.h"
#include "parallel/comm.h"
#include "train/adamw.h"
#include "train/grad_buffer.h"
#include "train/trainer_config.h"

namespace slimpi {

namespace h5 {
class File;
}
class MetricSums;
struct PackedBatch;

// Whether the HDF5 file at `path` (a trainer_state.h5) holds a critic group: written by a
// PPO run. Throws naming the file when it cannot be opened.
bool file_holds_critic(const std::string& path);

class Critic {
 public:
  // trainer: the policy trainer's config (precision, micro-batches, reducer, Adam betas);
  // its `critic` member holds the critic's own keys. The trunk starts as a copy of
  // `policy`'s trunk (its weights now), or from critic.init_from when set; a source
  // without a value head gets a fresh one (said in the log).
  // dp: the data-parallel group (distinct samples: counts, metrics); replicas: the ranks
  // holding the same parameters, over which gradients are summed (dp × the
  // context-parallel group; null: dp). The trunk is split over the policy's tensor and
  // context groups as the policy is.
  Critic(const TrainerConfig& trainer, const Transformer& policy, Comm* dp, uint64_t seed, Comm* replicas = nullptr);

  // Each sample's [R] values (R = its response length), no grad. Collective over the
  // tensor and context groups (its forwards), over dp only in that every rank calls it.
  std::vector<std::vector<float>> values(const std::vector<Sample>& samples) const;

  // One optimizer step of the value loss over this rank's share of the samples, which
  // carry `values` (the critic's before this rollout's first critic step) and `returns`.
  // Collective over dp. Returns train/value_loss, train/value_clipfrac,
  // train/critic_grad_norm, train/critic_lr, identical on every rank.
  std::map<std::string, double> train_step(const std::vector<Sample>& local);

  int64_t n_steps() const { return optimizer_->n_steps(); }
  // Rollouts the critic has trained on (critic.warmup_rollouts counts them).
  int64_t n_rollouts() const { return n_rollouts_; }
  void end_rollout() { ++n_rollouts_; }
  const std::vector<NamedTensor>& parameters() const { return trained_; }
  int64_t n_trained() const;  // elements the optimizer updates

  // Sets the trunk to `policy`'s (same config; its MTP layers are not read).
  void copy_trunk_from(const Transformer& policy);

  // Group "critic" of a trainer_state.h5 being written (collective over the file's
  // communicator: every tensor written by the first data-parallel rank (dp_first) among
  // the first holders of its part in the tensor group; the first failure
  // of this rank's writes goes into `error`, after every collective call was made), and
  // read back: false when the file holds no critic (written by a run without one).
  void save(const h5::File& file, bool dp_first, std::exception_ptr& error) const;
  bool load(const std::string& path);

 private:
  // [N] values of a packed micro-batch's response tokens (with autograd when enabled),
  // from the trunk's output `hidden` (the final norm's: its rows, under context parallelism).
  at::Tensor head_values(const PackedBatch& b, const at::Tensor& hidden) const;
  // Pipeline parallelism: each micro-batch of `plan` through the stages, every stage
  // returning the last stage's [N] values of each.
  std::vector<at::Tensor> pipelined_values(const std::vector<Sample>& samples,
                                           const std::vector<std::vector<int64_t>>& plan) const;
  // The value loss's forwards and backwards of one step's micro-batches (1F1B through the
  // stages); adds the loss terms to `sums` on the last stage.
  void pipelined_forwards_and_backwards(const std::vector<Sample>& local, const std::vector<std::vector<int64_t>>& plan,
                                        double n_samples, double n_masked, MetricSums& sums);
  // One micro-batch's value loss (Σ over its tokens of the per-token loss times the
  // reducer's weights) from its values; adds the terms to `sums`.
  at::Tensor value_loss(const std::vector<Sample>& local, const std::vector<int64_t>& which, const PackedBatch& batch,
                        const at::Tensor& v, double n_samples, double n_masked, MetricSums& sums) const;

  TrainerConfig cfg_;
  Comm* dp_;
  Comm* replicas_;  // gradients are summed over it (dp_ without context parallelism)
  std::unique_ptr<Transformer> trunk_;
  PipelineShard pipeline_;  // the policy's stage (size 1: no pipeline)
  at::Tensor head_weight_, head_bias_;  // [1, d], [1]
  std::vector<NamedTensor> trained_;    // the trunk's parameters the head reads through, then the head's
  // One gradient buffer per kind of parameter, with the group its norm adds up over and
  // how many replicas there count each element (as the Trainer's).
  struct Grads {
    std::unique_ptr<GradBuffer> buffer;
    Comm* norm_over = nullptr;
    double replicas = 1;
  };
  std::vector<Grads> grads_;
  double grad_norm() const;
  std::unique_ptr<AdamW> optimizer_;
  int64_t n_rollouts_ = 0;
};

}  // namespace slimpi
