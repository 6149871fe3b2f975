#include "train/rl_objective.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include "train/advantages.h"
#include "train/metric_sums.h"
#include "train/mismatch_correction.h"
#include "train/policy_loss.h"
#include "train/trainer_config.h"

namespace slimpi {

at::Tensor sft_objective(const ScoredMicroBatch& b, MetricSums& sums) {
  const at::Tensor nll = -b.logp;
  const at::Tensor loss = (nll * b.weight).sum();
  sums.add("train/loss", nll, b.weight);
  sums.add("train/entropy_loss", b.entropy, b.weight);
  return loss;
}

at::Tensor rl_objective(const TrainerConfig& cfg, const ScoredMicroBatch& b, MetricSums& sums) {
  const PolicyLoss& policy_loss = policy_losses().get(cfg.estimator->policy_loss);
  const PolicyLossTerms pg = policy_loss({b.logp, b.old_logp, b.advantages, b.sample_of_token, b.n_samples,
                                          cfg.eps_clip, cfg.eps_clip_high, cfg.eps_clip_c});
  at::Tensor pg_tokens = pg.loss;   // [N]
  at::Tensor weight = b.weight;     // [N] w', once the correction rejected tokens
  const bool have_rollout = b.rollout_logp.defined();
  // Off-policy correction against the engine's log-probs. Its metrics reduce with the
  // step's weights; tokens it rejects (MIS) leave the numerators of every loss term.
  if (cfg.use_tis) {
    SLIMPI_CHECK(have_rollout, "train.use_tis needs the rollout log-probs of every sample");
    const MismatchCorrection c =
        mismatch_correction(b.old_logp, b.rollout_logp, b.mask, b.sample_of_token, b.n_samples, cfg.mismatch);
    pg_tokens = pg_tokens * c.weight;
    for (const auto& [name, values] : c.metrics) sums.add("train/" + name, values, weight);
    sums.add("train/ois", at::exp(-pg.ppo_kl), weight);
    if (c.keep.defined()) weight = weight * c.keep;
  }
  if (have_rollout)  // slime compares the old log-probs (the current ones at a rollout's first step)
    sums.add("train/train_rollout_logprob_abs_diff", (b.old_logp - b.rollout_logp).abs(), weight);
  const at::Tensor pg_loss = (pg_tokens * weight).sum();
  const at::Tensor entropy_loss = (b.entropy * weight).sum();
  at::Tensor loss = pg_loss - cfg.entropy_coef * entropy_loss;
  sums.add("train/pg_loss", pg_tokens, weight);
  sums.add("train/pg_clipfrac", pg.clipfrac, weight);
  sums.add("train/ppo_kl", pg.ppo_kl, weight);
  if (cfg.use_kl_loss) {
    const at::Tensor kl = kl_estimate(b.logp, b.ref_logp, cfg.kl_loss_type);
    loss = loss + cfg.kl_loss_coef * (kl * weight).sum();
    sums.add("train/kl_loss", kl, weight);
  }
  sums.add_tensor("train/loss", loss);
  sums.add("train/entropy_loss", b.entropy, weight);
  return loss;
}

}  // namespace slimpi
