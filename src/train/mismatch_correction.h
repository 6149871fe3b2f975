// Off-policy correction of the policy-gradient term for the gap between the engine that
// sampled a token (rollout log-prob) and the trainer (its log-prob before the rollout's
// first optimizer step, "old"): train.use_tis with one of slime's functions.
//
//   r_t = old_t − rollout_t (log space), ρ_t = exp(r_t)
//   vanilla  w = clamp(ρ, tis_clip_low, tis_clip)             (slime's vanilla_tis_function)
//   icepop   w = ρ inside [tis_clip_low, tis_clip], else 0     (slime's icepop_function)
//   mis      slime's train/inference mismatch example (examples/train_infer_mismatch_helper
//            /mis.py): the log ratio at a level — token r_t, sequence Σ_t r_t, geometric
//            mean_t r_t (sums and means over the sample's loss-masked tokens) — clamped
//            to ±20, exponentiated, then bounded by mode: truncate min(w, upper), clip
//            clamp(w, lower, upper), mask (w kept, tokens outside [lower, upper]
//            rejected); optional rejection sampling (rs: tokens whose ratio at rs_level
//            leaves [rs_lower, rs_upper] rejected; rs_veto: a sample with any token ratio
//            below the threshold rejected whole); optional batch normalisation of w to
//            mean 1 over the micro-batch (token level: over masked tokens; sequence: over
//            samples). Rejected tokens drop out of the numerators of every loss term and
//            its metrics; the denominators (each sample's mask total) stay, as in slime.
// The loss uses weight · pg_loss_t. Metrics are per-token values reduced like the loss
// with the original masks: vanilla/icepop tis, tis_clipfrac, tis_abs; mis the mis_*
// family (perplexities, KL, χ², weight bounds and fractions). Stateless functions.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "core/registry.h"

namespace slimpi {

class Deck;

enum class TisFunction { Vanilla, Icepop, Mis };
enum class MisLevel { Token, Sequence, Geometric };
enum class MisMode { Truncate, Clip, Mask };
// The deck's names of each: train.tis_function ("vanilla", "icepop", "mis"),
// train.mis_level and train.mis_rs_level ("token", "sequence", "geometric"),
// train.mis_mode ("truncate", "clip", "mask").
const Registry<TisFunction>& tis_functions();
const Registry<MisLevel>& mis_levels();
const Registry<MisMode>& mis_modes();

struct MismatchConfig {
  TisFunction function = TisFunction::Vanilla;
  double tis_clip = 2.0, tis_clip_low = 0.0;  // vanilla, icepop
  MisLevel level = MisLevel::Token;           // mis from here on
  MisMode mode = MisMode::Truncate;
  double lower = 0.5, upper = 2.0;            // resolved (mis_lower 0 = 1 / mis_upper)
  bool rs = false;
  MisLevel rs_level = MisLevel::Token;
  double rs_lower = 0.5, rs_upper = 2.0;      // resolved (0 = the IS bounds)
  double rs_veto = 0.0;                       // 0 = no veto
  bool batch_normalize = false;

  // train.tis_function and the train.mis_* keys; refuses mis_* keys set for another
  // function and combinations slime refuses (geometric level with batch normalisation).
  static MismatchConfig from_deck(const Deck& deck);
};

struct MismatchCorrection {
  at::Tensor weight;  // [N] multiplies the per-token policy-gradient loss (no gradient)
  at::Tensor keep;    // [N] 1 = in the loss numerators, 0 = rejected (undefined: all kept)
  std::vector<std::pair<std::string, at::Tensor>> metrics;  // name (without "train/"), [N] per-token values
};

// train_logp, rollout_logp, mask: [N] fp32 over the micro-batch's response tokens;
// sample_of_token: [N] int64 in [0, n_samples).
MismatchCorrection mismatch_correction(const at::Tensor& train_logp, const at::Tensor& rollout_logp,
                                       const at::Tensor& mask, const at::Tensor& sample_of_token,
                                       int64_t n_samples, const MismatchConfig& cfg);

// The metric names mismatch_correction returns for `cfg`, in its order.
std::vector<std::string> mismatch_metric_names(const MismatchConfig& cfg);

}  // namespace slimpi
