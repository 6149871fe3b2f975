#include "train/gae.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

namespace slimpi {

GaeResult generalized_advantages(const at::Tensor& rewards, const at::Tensor& values, const at::Tensor& mask,
                                 double gamma, double lambd) {
  SLIMPI_CHECK(rewards.dim() == 1 && values.sizes() == rewards.sizes() && mask.sizes() == rewards.sizes(),
               "GAE: rewards ({} elements), values ({}) and mask ({}) must be one [R] each", rewards.numel(),
               values.numel(), mask.numel());
  const at::Tensor r = rewards.to(at::kDouble).cpu().contiguous();
  const at::Tensor v = values.to(at::kDouble).cpu().contiguous();
  const at::Tensor m = mask.to(at::kDouble).cpu().contiguous();
  at::Tensor adv = at::zeros_like(v);
  const double* rp = r.data_ptr<double>();
  const double* vp = v.data_ptr<double>();
  const double* mp = m.data_ptr<double>();
  double* ap = adv.data_ptr<double>();
  double next_value = 0.0, next_adv = 0.0, carried_reward = 0.0;  // of the next counted token; rewards after it
  for (int64_t t = r.numel() - 1; t >= 0; --t) {
    if (mp[t] == 0.0) {
      carried_reward += rp[t];
      continue;
    }
    const double delta = rp[t] + carried_reward + gamma * next_value - vp[t];
    ap[t] = next_adv = delta + gamma * lambd * next_adv;
    next_value = vp[t];
    carried_reward = 0.0;
  }
  GaeResult out;
  out.returns = (adv + v).to(at::kFloat).to(rewards.device());
  out.advantages = adv.to(at::kFloat).to(rewards.device());
  return out;
}

}  // namespace slimpi
