#include "train/adamw.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>

#include <cmath>

namespace slimpi {

AdamW::AdamW(const std::vector<NamedTensor>& params, const Options& options) : params_(params), options_(options) {
  for (const auto& p : params_) {
    exp_avg_.push_back(at::zeros_like(p.tensor).detach());
    exp_avg_sq_.push_back(at::zeros_like(p.tensor).detach());
  }
}

void adamw_update(at::Tensor p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, double lr, int64_t t,
                  const AdamWOptions& o, bool decay) {
  const double bias1 = 1.0 - std::pow(o.beta1, double(t));
  const double bias2 = 1.0 - std::pow(o.beta2, double(t));
  // Elementwise, so a run of 2^20 elements at a time: the denominator is the one
  // temporary, 4 MB, where a whole tensor's would be its size (two of them, 1.2 GB for a
  // 622 MB embedding, were the np-1 Qwen3-0.6B-shaped step's peak).
  constexpr int64_t kPiece = int64_t(1) << 20;
  const int64_t n = p.numel();
  at::Tensor pf = p.view({-1}), mf = m.view({-1}), vf = v.view({-1});
  const at::Tensor gf = g.reshape({-1});
  for (int64_t at = 0; at < n; at += kPiece) {
    const int64_t len = std::min(kPiece, n - at);
    at::Tensor pp = pf.narrow(0, at, len), mp = mf.narrow(0, at, len), vp = vf.narrow(0, at, len);
    const at::Tensor gp = gf.narrow(0, at, len);
    if (o.weight_decay != 0.0 && decay) pp.mul_(1.0 - lr * o.weight_decay);
    mp.mul_(o.beta1).add_(gp, 1.0 - o.beta1);
    vp.mul_(o.beta2).addcmul_(gp, gp, 1.0 - o.beta2);
    at::Tensor denom = vp.sqrt();
    denom.div_(std::sqrt(bias2)).add_(o.eps);
    pp.addcdiv_(mp, denom, -lr / bias1);
  }
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  ++t_;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor p = params_[i].tensor;
    const at::Tensor& g = p.grad();
    SLIMPI_CHECK(g.defined(), "AdamW: parameter {} has no gradient", params_[i].name);
    adamw_update(p, g, exp_avg_[i], exp_avg_sq_[i], lr, t_, options_, p.dim() >= 2);
  }
}

std::vector<NamedTensor> AdamW::state() const {
  std::vector<NamedTensor> out;
  for (size_t i = 0; i < params_.size(); ++i) out.push_back({"exp_avg/" + params_[i].name, exp_avg_[i]});
  for (size_t i = 0; i < params_.size(); ++i) out.push_back({"exp_avg_sq/" + params_[i].name, exp_avg_sq_[i]});
  return out;
}

}  // namespace slimpi
