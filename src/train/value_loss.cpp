#include "train/value_loss.h"

#include <ATen/ATen.h>

namespace slimpi {

ValueLossTerms value_loss_terms(const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                                double value_clip) {
  const at::Tensor change = values - old_values;  // [N]
  const at::Tensor clipped_values = old_values + change.clamp(-value_clip, value_clip);
  ValueLossTerms out;
  out.loss = at::maximum((clipped_values - returns).square(), (values - returns).square());
  out.clipped = (change.detach().abs() > value_clip).to(at::kFloat);
  return out;
}

}  // namespace slimpi
