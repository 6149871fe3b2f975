#include "train/policy_loss.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include <fmt/ranges.h>

namespace slimpi {
namespace {

// The clipped surrogate given ρ (with its gradient) and the advantages.
PolicyLossTerms clipped_surrogate(const at::Tensor& ratio, const at::Tensor& ppo_kl, const at::Tensor& adv,
                                  double eps_clip, double eps_clip_high, double eps_clip_c) {
  at::Tensor l1 = -ratio * adv;
  at::Tensor l2 = -at::clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip_high) * adv;
  PolicyLossTerms out;
  out.loss = at::maximum(l1, l2);
  out.clipfrac = at::gt(l2, l1).to(at::kFloat);
  if (eps_clip_c > 1.0) {
    at::Tensor l3 = -eps_clip_c * adv;
    out.loss = at::where(adv < 0, at::minimum(out.loss, l3), out.loss);
  }
  out.ppo_kl = ppo_kl;
  return out;
}

}  // namespace

PolicyLossTerms ppo_clip_loss(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
                              double eps_clip, double eps_clip_high, double eps_clip_c) {
  at::Tensor ppo_kl = old_logp - logp;
  return clipped_surrogate(at::exp(-ppo_kl), ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c);
}

at::Tensor segment_mean(const at::Tensor& values, const at::Tensor& segment, int64_t n_segments) {
  at::Tensor sums = at::zeros({n_segments}, values.options()).index_add(0, segment, values);
  at::Tensor counts = at::zeros({n_segments}, values.options()).index_add(0, segment, at::ones_like(values));
  return sums / at::clamp_min(counts, 1.0);
}

PolicyLossTerms gspo_loss(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
                          const at::Tensor& sample_of_token, int64_t n_samples, double eps_clip,
                          double eps_clip_high, double eps_clip_c) {
  at::Tensor seq_kl = segment_mean(old_logp - logp, sample_of_token, n_samples);  // [n_samples]
  at::Tensor ppo_kl = seq_kl.index_select(0, sample_of_token);                     // [N]
  return clipped_surrogate(at::exp(-ppo_kl), ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c);
}

at::Tensor cispo_clamped_ratio(const at::Tensor& ratio, double eps_clip, double eps_clip_high) {
  return at::clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip_high);
}

PolicyLossTerms cispo_loss(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
                           double eps_clip, double eps_clip_high) {
  at::Tensor ppo_kl = old_logp - logp;
  at::Tensor ratio = at::exp(-ppo_kl).detach();
  at::Tensor clamped = cispo_clamped_ratio(ratio, eps_clip, eps_clip_high);
  PolicyLossTerms out;
  out.loss = -clamped * advantages * logp;
  out.clipfrac = at::ne(clamped, ratio).to(at::kFloat);
  out.ppo_kl = ppo_kl;
  return out;
}

const std::vector<std::string>& kl_types() {
  static const std::vector<std::string> types{"k1", "k2", "k3", "low_var_kl"};
  return types;
}

at::Tensor kl_estimate(const at::Tensor& logp, const at::Tensor& ref_logp, const std::string& kl_type) {
  at::Tensor d = logp - ref_logp;
  if (kl_type == "k1") return d;
  if (kl_type == "k2") return d.pow(2) / 2;
  if (kl_type == "k3") return at::exp(-d) - 1 + d;
  if (kl_type == "low_var_kl") return at::clamp(at::exp(-d) - 1 + d, -10.0, 10.0);
  SLIMPI_FAIL("unknown KL estimator '{}'; valid: {}", kl_type, fmt::join(kl_types(), ", "));
}

TisWeights tis_weights(const at::Tensor& old_logp, const at::Tensor& rollout_logp, double tis_clip_low,
                       double tis_clip) {
  at::Tensor raw = at::exp(old_logp - rollout_logp).detach();
  TisWeights w;
  w.weight = at::clamp(raw, tis_clip_low, tis_clip);
  w.clipfrac = at::ne(w.weight, raw).to(at::kFloat);
  w.abs_dev = at::abs(raw - 1);
  return w;
}

}  // namespace slimpi
