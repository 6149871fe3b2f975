#include "train/policy_loss.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

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

const Registry<PolicyLoss>& policy_losses() {
  static const Registry<PolicyLoss> r = [] {
    Registry<PolicyLoss> reg("policy loss");
    reg.add("ppo_clip", [](const PolicyLossInputs& in) {
      return ppo_clip_loss(in.logp, in.old_logp, in.advantages, in.eps_clip, in.eps_clip_high, in.eps_clip_c);
    });
    reg.add("gspo", [](const PolicyLossInputs& in) {
      return gspo_loss(in.logp, in.old_logp, in.advantages, in.sample_of_token, in.n_samples, in.eps_clip,
                       in.eps_clip_high, in.eps_clip_c);
    });
    reg.add("cispo", [](const PolicyLossInputs& in) {
      return cispo_loss(in.logp, in.old_logp, in.advantages, in.eps_clip, in.eps_clip_high);
    });
    return reg;
  }();
  return r;
}

const Registry<KlEstimator>& kl_types() {
  static const Registry<KlEstimator> r = [] {
    Registry<KlEstimator> reg("train.kl_loss_type");
    reg.add("k1", [](const at::Tensor& d) { return d; });
    reg.add("k2", [](const at::Tensor& d) { return d.pow(2) / 2; });
    reg.add("k3", [](const at::Tensor& d) { return at::exp(-d) - 1 + d; });
    reg.add("low_var_kl", [](const at::Tensor& d) { return at::clamp(at::exp(-d) - 1 + d, -10.0, 10.0); });
    return reg;
  }();
  return r;
}

at::Tensor kl_estimate(const at::Tensor& logp, const at::Tensor& ref_logp, const std::string& kl_type) {
  return kl_types().get(kl_type)(logp - ref_logp);
}

}  // namespace slimpi
