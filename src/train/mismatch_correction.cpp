#include "train/mismatch_correction.h"

#include <ATen/ATen.h>
#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <cmath>
#include <limits>

namespace slimpi {
namespace {

constexpr double kSafetyBound = 20.0;  // |log ratio| before exp (slime's SAFETY_BOUND)

// Per-sample reductions over a micro-batch's tokens ([N] values, [N] sample index).
struct Segments {
  const at::Tensor& seg;  // [N] int64
  int64_t n;              // samples

  at::Tensor sum(const at::Tensor& x) const {  // [S]
    return at::zeros({n}, x.options()).index_add_(0, seg, x);
  }
  at::Tensor expand(const at::Tensor& per_sample) const { return per_sample.index_select(0, seg); }  // [N]
  at::Tensor masked_sum(const at::Tensor& x, const at::Tensor& m) const { return expand(sum(x * m)); }
  at::Tensor masked_mean_per_sample(const at::Tensor& x, const at::Tensor& m) const {  // [S]
    return sum(x * m) / at::clamp_min(sum(m), 1.0);
  }
  at::Tensor masked_mean(const at::Tensor& x, const at::Tensor& m) const {
    return expand(masked_mean_per_sample(x, m));
  }
  // min / max over a sample's masked tokens; 0 for a sample without any (as slime).
  at::Tensor masked_extreme(const at::Tensor& x, const at::Tensor& m, bool max) const {
    const double fill = max ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    at::Tensor src = at::where(m > 0, x, at::full_like(x, fill));
    at::Tensor out = at::full({n}, fill, x.options()).scatter_reduce(0, seg, src, max ? "amax" : "amin", true);
    return expand(at::where(at::isinf(out), at::zeros_like(out), out));
  }
};

at::Tensor log_ratio_at(MisLevel level, const at::Tensor& raw, const at::Tensor& m, const Segments& s) {
  switch (level) {
    case MisLevel::Sequence: return s.masked_sum(raw, m);
    case MisLevel::Geometric: return s.masked_mean(raw, m);
    default: return raw;
  }
}

at::Tensor as_float(const at::Tensor& b) { return b.to(at::kFloat); }

}  // namespace

const Registry<TisFunction>& tis_functions() {
  static const Registry<TisFunction> r(
      "train.tis_function", {{"vanilla", TisFunction::Vanilla}, {"icepop", TisFunction::Icepop}, {"mis", TisFunction::Mis}});
  return r;
}

const Registry<MisLevel>& mis_levels() {
  static const Registry<MisLevel> r("train.mis_level / train.mis_rs_level", {{"token", MisLevel::Token},
                                                                             {"sequence", MisLevel::Sequence},
                                                                             {"geometric", MisLevel::Geometric}});
  return r;
}

const Registry<MisMode>& mis_modes() {
  static const Registry<MisMode> r(
      "train.mis_mode", {{"truncate", MisMode::Truncate}, {"clip", MisMode::Clip}, {"mask", MisMode::Mask}});
  return r;
}

MismatchConfig MismatchConfig::from_deck(const Deck& deck) {
  MismatchConfig c;
  const std::string f = deck.get_string("train.tis_function");
  c.function = tis_functions().get(f);
  c.tis_clip = deck.get_float("train.tis_clip");
  c.tis_clip_low = deck.get_float("train.tis_clip_low");
  const char* mis_keys[] = {"train.mis_level",    "train.mis_mode",     "train.mis_lower",
                            "train.mis_upper",    "train.mis_rs",       "train.mis_rs_level",
                            "train.mis_rs_lower", "train.mis_rs_upper", "train.mis_rs_veto",
                            "train.mis_batch_normalize"};
  if (c.function != TisFunction::Mis) {
    for (const char* k : mis_keys)
      if (!deck.has_default_value(k))
        SLIMPI_FAIL_ALL("{} ({}) configures train.tis_function = \"mis\", but it is \"{}\" ({})", k, deck.source(k), f,
                        deck.source("train.tis_function"));
    if (c.tis_clip_low > c.tis_clip)
      SLIMPI_FAIL_ALL("train.tis_clip_low = {} ({}) exceeds train.tis_clip = {} ({})", c.tis_clip_low,
                      deck.source("train.tis_clip_low"), c.tis_clip, deck.source("train.tis_clip"));
    return c;
  }
  for (const char* k : {"train.tis_clip", "train.tis_clip_low"})
    if (!deck.has_default_value(k))
      SLIMPI_FAIL_ALL("{} ({}) bounds the vanilla and icepop weights; train.tis_function = \"mis\" ({}) uses "
                      "train.mis_lower and train.mis_upper",
                      k, deck.source(k), deck.source("train.tis_function"));
  c.level = mis_levels().get(deck.get_string("train.mis_level"));
  const std::string mode = deck.get_string("train.mis_mode");
  c.mode = mis_modes().get(mode);
  c.upper = deck.get_float("train.mis_upper");
  c.lower = deck.get_float("train.mis_lower") > 0 ? deck.get_float("train.mis_lower") : 1.0 / c.upper;
  c.rs = deck.get_bool("train.mis_rs");
  c.rs_level = mis_levels().get(deck.get_string("train.mis_rs_level"));
  c.rs_lower = deck.get_float("train.mis_rs_lower") > 0 ? deck.get_float("train.mis_rs_lower") : c.lower;
  c.rs_upper = deck.get_float("train.mis_rs_upper") > 0 ? deck.get_float("train.mis_rs_upper") : c.upper;
  c.rs_veto = deck.get_float("train.mis_rs_veto");
  c.batch_normalize = deck.get_bool("train.mis_batch_normalize");
  if (c.mode == MisMode::Truncate && !c.rs && !deck.has_default_value("train.mis_lower"))
    SLIMPI_FAIL_ALL("train.mis_lower ({}) bounds the clip and mask modes and rejection sampling; train.mis_mode = "
                    "\"truncate\" ({}) only caps the weight at train.mis_upper",
                    deck.source("train.mis_lower"), deck.source("train.mis_mode"));
  if (c.mode != MisMode::Truncate && !(c.lower < c.upper))
    SLIMPI_FAIL_ALL("train.mis_mode = \"{}\" ({}) needs train.mis_lower < train.mis_upper ({} and {})", mode,
                    deck.source("train.mis_mode"), c.lower, c.upper);
  if (c.rs && !(c.rs_lower < c.rs_upper))
    SLIMPI_FAIL_ALL("train.mis_rs ({}) needs train.mis_rs_lower < train.mis_rs_upper ({} and {})",
                    deck.source("train.mis_rs"), c.rs_lower, c.rs_upper);
  for (const char* k : {"train.mis_rs_level", "train.mis_rs_lower", "train.mis_rs_upper", "train.mis_rs_veto"})
    if (!c.rs && !deck.has_default_value(k))
      SLIMPI_FAIL_ALL("{} ({}) configures rejection sampling, but train.mis_rs = false ({})", k, deck.source(k),
                      deck.source("train.mis_rs"));
  if (c.batch_normalize && c.level == MisLevel::Geometric)
    SLIMPI_FAIL_ALL("train.mis_batch_normalize ({}) normalises token or sequence weights; train.mis_level = "
                    "\"geometric\" ({}) has no such mean in slime",
                    deck.source("train.mis_batch_normalize"), deck.source("train.mis_level"));
  return c;
}

std::vector<std::string> mismatch_metric_names(const MismatchConfig& cfg) {
  if (cfg.function != TisFunction::Mis) return {"tis", "tis_clipfrac", "tis_abs"};
  std::vector<std::string> n = {"training_log_ppl", "training_ppl", "rollout_log_ppl", "rollout_ppl",
                                "kl",               "k3_kl",        "log_ppl_diff",    "log_ppl_abs_diff",
                                "ppl_ratio",        "chi2_token",   "chi2_seq",        "tis_weight_before_bound"};
  if (cfg.mode == MisMode::Truncate) n.push_back("tis_truncate_fraction");
  if (cfg.mode == MisMode::Clip) n.insert(n.end(), {"tis_clip_fraction_low", "tis_clip_fraction_high"});
  if (cfg.mode == MisMode::Mask) n.insert(n.end(), {"tis_mask_fraction_low", "tis_mask_fraction_high"});
  n.push_back("tis_weight_after_bound");
  if (cfg.rs) n.insert(n.end(), {"rs_mask_fraction_low", "rs_mask_fraction_high"});
  if (cfg.rs && cfg.rs_veto > 0) n.insert(n.end(), {"rs_catastrophic_token_fraction", "rs_catastrophic_seq_fraction"});
  n.push_back("is_ratio_mean_after_tis_rs");
  if (cfg.batch_normalize) n.push_back("batch_norm_factor");
  n.insert(n.end(), {"is_ratio_mean_final", "is_ratio_min_final", "is_ratio_max_final"});
  for (auto& name : n) name = "mis_" + name;
  return n;
}

namespace {

using Metrics = std::vector<std::pair<std::string, at::Tensor>>;

// vanilla and icepop: the token ratio clamped, or zeroed outside its bounds.
MismatchCorrection tis_correction(const at::Tensor& raw, const MismatchConfig& cfg) {
  MismatchCorrection out;
  const at::Tensor ratio = at::exp(raw);
  if (cfg.function == TisFunction::Vanilla) {
    out.weight = at::clamp(ratio, cfg.tis_clip_low, cfg.tis_clip);
  } else {
    out.weight = at::where((ratio >= cfg.tis_clip_low) & (ratio <= cfg.tis_clip), ratio, at::zeros_like(ratio));
  }
  out.metrics.emplace_back("tis", ratio);
  out.metrics.emplace_back("tis_clipfrac", as_float(at::ne(out.weight, ratio)));
  out.metrics.emplace_back("tis_abs", at::abs(ratio - 1));
  return out;
}

// Perplexities, KL estimates and χ² between the two policies (slime's add_ppl_metrics).
void add_policy_gap_metrics(const at::Tensor& train_logp, const at::Tensor& rollout_logp, const at::Tensor& raw,
                            const at::Tensor& m, const Segments& s, Metrics& metrics) {
  auto metric = [&](const std::string& name, const at::Tensor& v) { metrics.emplace_back(name, v); };
  const at::Tensor mean_train = s.masked_mean(train_logp, m), mean_rollout = s.masked_mean(rollout_logp, m);
  metric("mis_training_log_ppl", -mean_train);
  metric("mis_training_ppl", at::exp(-mean_train));
  metric("mis_rollout_log_ppl", -mean_rollout);
  metric("mis_rollout_ppl", at::exp(-mean_rollout));
  metric("mis_kl", rollout_logp - train_logp);
  metric("mis_k3_kl", at::exp(raw) - raw - 1);
  const at::Tensor log_ppl_diff = mean_rollout - mean_train;
  metric("mis_log_ppl_diff", log_ppl_diff);
  metric("mis_log_ppl_abs_diff", log_ppl_diff.abs());
  metric("mis_ppl_ratio", at::exp(log_ppl_diff));
  const at::Tensor rho = at::exp(at::clamp(raw, -kSafetyBound, kSafetyBound));
  metric("mis_chi2_token", s.masked_mean(rho.square(), m) - 1.0);
  metric("mis_chi2_seq", at::exp(2.0 * at::clamp(s.masked_sum(raw, m), -kSafetyBound, kSafetyBound)) - 1.0);
}

// The weights bounded by mis_mode: truncated, clipped, or masked (keep: the tokens left).
void bound_weights(const MismatchConfig& cfg, const at::Tensor& m, at::Tensor& w, at::Tensor& keep,
                   Metrics& metrics) {
  auto metric = [&](const std::string& name, const at::Tensor& v) { metrics.emplace_back(name, v); };
  switch (cfg.mode) {
    case MisMode::Truncate:
      metric("mis_tis_truncate_fraction", as_float(w > cfg.upper));
      w = at::clamp(w, 0.0, cfg.upper) * m;
      break;
    case MisMode::Clip:
      metric("mis_tis_clip_fraction_low", as_float(w < cfg.lower));
      metric("mis_tis_clip_fraction_high", as_float(w > cfg.upper));
      w = at::clamp(w, cfg.lower, cfg.upper) * m;
      break;
    case MisMode::Mask:
      metric("mis_tis_mask_fraction_low", as_float(w < cfg.lower));
      metric("mis_tis_mask_fraction_high", as_float(w > cfg.upper));
      keep = m * as_float((w >= cfg.lower) & (w <= cfg.upper));
      w = w * m;
      break;
  }
}

// Rejection sampling: tokens (or samples) whose ratio at rs_level leaves the bounds, and
// with a veto every sample holding a catastrophic token, leave `keep`.
void reject_samples(const MismatchConfig& cfg, const at::Tensor& raw, const at::Tensor& log_ratio,
                    const at::Tensor& m, const Segments& s, at::Tensor& keep, Metrics& metrics) {
  auto metric = [&](const std::string& name, const at::Tensor& v) { metrics.emplace_back(name, v); };
  const at::Tensor rs_log = cfg.rs_level == cfg.level ? log_ratio : log_ratio_at(cfg.rs_level, raw, m, s);
  const at::Tensor rs_w = at::exp(at::clamp(rs_log, -kSafetyBound, kSafetyBound));
  metric("mis_rs_mask_fraction_low", as_float(rs_w < cfg.rs_lower));
  metric("mis_rs_mask_fraction_high", as_float(rs_w > cfg.rs_upper));
  keep = keep * as_float((rs_w >= cfg.rs_lower) & (rs_w <= cfg.rs_upper));
  if (cfg.rs_veto > 0) {  // a sample with any catastrophic token is rejected whole
    const at::Tensor catastrophic = as_float((raw < std::log(cfg.rs_veto)) & (m > 0));
    const at::Tensor vetoed = s.expand(as_float(s.sum(catastrophic) > 0));
    metric("mis_rs_catastrophic_token_fraction", catastrophic);
    metric("mis_rs_catastrophic_seq_fraction", vetoed);
    keep = keep * (1 - vetoed);
  }
}

// The weights normalised to mean 1 over the micro-batch (token level: over masked
// tokens; sequence levels: over samples).
void normalize_batch(const MismatchConfig& cfg, const at::Tensor& m, const Segments& s, at::Tensor& w,
                     Metrics& metrics) {
  const at::Tensor mean = cfg.level == MisLevel::Token ? (w * m).sum() / at::clamp_min(m.sum(), 1.0)
                                                       : s.masked_mean_per_sample(w, m).mean();
  if (mean.item<double>() > 1e-8) {
    w = w / mean;
    metrics.emplace_back("mis_batch_norm_factor", mean.expand_as(w));
  } else {
    metrics.emplace_back("mis_batch_norm_factor", at::ones_like(w));
  }
}

}  // namespace

MismatchCorrection mismatch_correction(const at::Tensor& train_logp_in, const at::Tensor& rollout_logp,
                                       const at::Tensor& mask, const at::Tensor& sample_of_token,
                                       int64_t n_samples, const MismatchConfig& cfg) {
  const at::Tensor train_logp = train_logp_in.detach();
  const at::Tensor raw = train_logp - rollout_logp;  // [N] log ρ per token
  if (cfg.function != TisFunction::Mis) return tis_correction(raw, cfg);
  MismatchCorrection out;
  Metrics& metrics = out.metrics;
  const Segments s{sample_of_token, n_samples};
  const at::Tensor m = mask.to(at::kFloat);
  add_policy_gap_metrics(train_logp, rollout_logp, raw, m, s, metrics);
  // Importance weights at the configured level, bounded by the mode.
  const at::Tensor log_ratio = log_ratio_at(cfg.level, raw, m, s);
  at::Tensor w = at::exp(at::clamp(log_ratio, -kSafetyBound, kSafetyBound));
  at::Tensor keep = m.clone();
  metrics.emplace_back("mis_tis_weight_before_bound", w);
  bound_weights(cfg, m, w, keep, metrics);
  metrics.emplace_back("mis_tis_weight_after_bound", w);
  if (cfg.rs) reject_samples(cfg, raw, log_ratio, m, s, keep, metrics);
  metrics.emplace_back("mis_is_ratio_mean_after_tis_rs", w);
  if (cfg.batch_normalize) normalize_batch(cfg, m, s, w, metrics);
  metrics.emplace_back("mis_is_ratio_mean_final", s.masked_mean(w, m));
  metrics.emplace_back("mis_is_ratio_min_final", s.masked_extreme(w, m, false));
  metrics.emplace_back("mis_is_ratio_max_final", s.masked_extreme(w, m, true));
  out.weight = w.detach();
  out.keep = keep.detach();
  return out;
}

}  // namespace slimpi
