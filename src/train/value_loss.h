// The critic's clipped value loss, slime's value_loss_function, per token:
//   V_clip = V_old + clip(V − V_old, −c, +c)
//   loss_t = max((V_clip − G)², (V − G)²)        (no ½, as slime)
//   clipped_t = [|V − V_old| > c]                 (train/value_clipfrac)
// V: the critic's value now (with autograd), V_old: before the rollout's first critic
// step, G: the GAE returns (train/gae.h), c = critic.value_clip. The caller reduces both
// with the policy loss's reducer (slime's sum_of_sample_mean).
#pragma once

#include <ATen/core/Tensor.h>

namespace slimpi {

struct ValueLossTerms {
  at::Tensor loss;     // [N]
  at::Tensor clipped;  // [N] fp32 0/1
};

// values, old_values, returns: [N].
ValueLossTerms value_loss_terms(const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                                double value_clip);

}  // namespace slimpi
