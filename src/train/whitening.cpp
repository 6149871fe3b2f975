#include "train/whitening.h"

#include <ATen/ATen.h>

#include "parallel/comm_tensor.h"

namespace slimpi {

void whiten_advantages(std::vector<at::Tensor>& advantages, const std::vector<at::Tensor>& masks, Comm* comm) {
  at::Tensor sums = at::zeros({3}, at::kDouble);  // [ΣA·m, Σm, ΣA²·m]
  for (size_t i = 0; i < advantages.size(); ++i) {
    at::Tensor a = advantages[i].to(at::kDouble).cpu(), m = masks[i].to(at::kDouble).cpu();
    sums[0] += (a * m).sum();
    sums[1] += m.sum();
    sums[2] += (a * a * m).sum();
  }
  if (comm) allreduce(*comm, sums);
  const double n = sums[1].item<double>();
  if (n < 1) return;
  const double mean = sums[0].item<double>() / n;
  double var = sums[2].item<double>() / n - mean * mean;
  if (n > 1) var *= n / (n - 1);
  const double scale = 1.0 / std::sqrt(var + 1e-8);
  for (auto& a : advantages) a = ((a.to(at::kDouble) - mean) * scale).to(a.scalar_type());
}

}  // namespace slimpi
