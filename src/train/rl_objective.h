// The loss of one micro-batch, as slime's actor writes it, over tokens already scored:
// a function of per-token tensors, callable without a model (tests pin slime's numbers
// on it). The trainer packs, forwards and scores; this adds the terms up.
//
// All tensors [N] over the micro-batch's response tokens; `weight` is the reducer's
// (m / (D_i · n_samples) per rollout, or m / n_masked per token), so a sum over the
// step's micro-batches and ranks is the step's mean.
//   SFT:  L = Σ −logp · w
//   RL:   L = Σ pg_t · c_t · w'  −  entropy_coef · Σ H_t · w'  [+ kl_loss_coef · Σ KL_t · w']
//         pg: the estimator's policy loss (train/policy_loss.h); c, w' = w · keep: the
//         off-policy correction against the engine's log-probs (train.use_tis,
//         train/mismatch_correction.h), c = 1 and keep = 1 without it; KL of logp
//         against the reference (train.kl_loss_type).
// Metric terms go into `sums`: the correction's own and train/ois weighted with w (before
// it rejects tokens); train/loss, pg_loss, pg_clipfrac, ppo_kl, entropy_loss, kl_loss and
// train_rollout_logprob_abs_diff with w'.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace slimpi {

class MetricSums;
struct TrainerConfig;

struct ScoredMicroBatch {
  at::Tensor logp;             // [N] the policy's log-probs, with autograd
  at::Tensor entropy;          // [N] with autograd
  at::Tensor mask;             // [N] loss mask
  at::Tensor weight;           // [N] reducer weights
  // RL only:
  at::Tensor old_logp;         // [N] before the rollout's first optimizer step
  at::Tensor advantages;       // [N]
  at::Tensor rollout_logp;     // [N] the engine's; undefined when the samples carry none
  at::Tensor ref_logp;         // [N] the reference's; needed with train.use_kl_loss
  at::Tensor sample_of_token;  // [N] int64, 0..n_samples-1
  int64_t n_samples = 0;       // of the micro-batch
};

// The scalar loss to differentiate (0-dim).
at::Tensor sft_objective(const ScoredMicroBatch& b, MetricSums& sums);
at::Tensor rl_objective(const TrainerConfig& cfg, const ScoredMicroBatch& b, MetricSums& sums);

}  // namespace slimpi
