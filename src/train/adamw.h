// AdamW — the trainer's optimizer, on the model's named parameters, state kept as
// named tensors so that checkpoints store it under the parameters' own names.
// Update (PyTorch's AdamW, decoupled weight decay), with t = steps taken:
//   p ← p·(1 − lr·wd)                               (matrices only: dim ≥ 2)
//   m ← β1·m + (1−β1)·g,   v ← β2·v + (1−β2)·g²
//   p ← p − lr/(1−β1^t) · m / (sqrt(v)/sqrt(1−β2^t) + eps)
// Owned by the Trainer; reads p.grad(), which must be defined for every parameter.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "model/transformer.h"

namespace slimpi {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// The update of step t (≥ 1) on one stretch of elements, in place: p, its gradient g and
// moments m, v (same shape). decay: whether weight decay applies (the parameter is a matrix).
void adamw_update(at::Tensor p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, double lr, int64_t t,
                  const AdamWOptions& o, bool decay);

class AdamW {
 public:
  using Options = AdamWOptions;

  AdamW(const std::vector<NamedTensor>& params, const Options& options);

  void step(double lr);
  int64_t n_steps() const { return t_; }

  // "exp_avg/<param name>" and "exp_avg_sq/<param name>", in parameter order: the
  // moments themselves (a checkpoint load reads into them in place).
  std::vector<NamedTensor> state() const;
  // The step count of moments loaded into state().
  void set_n_steps(int64_t n_steps) { t_ = n_steps; }

 private:
  std::vector<NamedTensor> params_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  Options options_;
  int64_t t_ = 0;
};

}  // namespace slimpi
