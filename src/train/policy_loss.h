// Per-token policy-gradient losses and the quantities logged with them, slime's
// definitions (slime's formulas: docs/rl_loop.md). All tensors are [N] over response
// tokens unless noted; reduction to a scalar is the Reducer's job (train/reducer.h).
//
//   ppo_kl = logp_old − logp,  ρ = exp(−ppo_kl)
//   PPO clip:  L = max(−ρA, −clip(ρ, 1−ε, 1+ε_high)·A);  clipfrac = [clipped term larger]
//   dual clip (c > 1):  for A < 0, L = min(L, −c·A)
//   GSPO:      ρ per sequence = exp(mean over its tokens of (logp − logp_old)), same clip
//   CISPO:     L = −stopgrad(clip(ρ, 1−ε, 1+ε_high))·A·logp
//   KL (d = logp − logp_ref): k1 = d, k2 = d²/2, k3 = low_var_kl = e^(−d) − 1 + d,
//              low_var_kl alone clamped to [−10, 10]
//   TIS and its variants (icepop, MIS): train/mismatch_correction.h
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "core/registry.h"

namespace slimpi {

struct PolicyLossTerms {
  at::Tensor loss;      // [N] per-token loss
  at::Tensor clipfrac;  // [N] 1.0 where the clip acted, else 0.0
  at::Tensor ppo_kl;    // [N] logp_old − logp (per sequence for GSPO, broadcast to tokens)
};

// eps_clip_c <= 1 turns the dual clip off.
PolicyLossTerms ppo_clip_loss(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
                              double eps_clip, double eps_clip_high, double eps_clip_c);

// GSPO: `sample_of_token` [N] int64 (0..n_samples-1) says which sequence a token is in.
PolicyLossTerms gspo_loss(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
                          const at::Tensor& sample_of_token, int64_t n_samples, double eps_clip,
                          double eps_clip_high, double eps_clip_c);

PolicyLossTerms cispo_loss(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
                           double eps_clip, double eps_clip_high);

// The clamp CISPO applies to ρ (exposed for tests): clip(ρ, 1−ε, 1+ε_high).
at::Tensor cispo_clamped_ratio(const at::Tensor& ratio, double eps_clip, double eps_clip_high);

// The policy losses as one registry (each advantage estimator names the one it trains
// with, train/advantages.h): "ppo_clip", "gspo", "cispo".
struct PolicyLossInputs {
  at::Tensor logp, old_logp, advantages;  // [N]
  at::Tensor sample_of_token;             // [N] int64 (0..n_samples-1)
  int64_t n_samples = 0;
  double eps_clip = 0.2, eps_clip_high = 0.2, eps_clip_c = 0.0;
};
using PolicyLoss = std::function<PolicyLossTerms(const PolicyLossInputs&)>;
const Registry<PolicyLoss>& policy_losses();

// KL estimators of d = logp − logp_ref, a registry keyed by train.kl_loss_type:
// "k1" | "k2" | "k3" | "low_var_kl" (k3 is unclamped, low_var_kl clamped).
using KlEstimator = at::Tensor (*)(const at::Tensor& d);
const Registry<KlEstimator>& kl_types();
at::Tensor kl_estimate(const at::Tensor& logp, const at::Tensor& ref_logp, const std::string& kl_type);

// Segment mean: out[i] = mean of values[j] over j with segment[j] == i. [N] -> [n_segments]
at::Tensor segment_mean(const at::Tensor& values, const at::Tensor& segment, int64_t n_segments);

}  // namespace slimpi
