// MetricSums — sums of weighted per-token metrics over one optimizer step (or one
// rollout's preparation) on this rank, reduced over the data-parallel ranks at its end.
// Owned by the caller for the step's length. Tensor terms accumulate where they live
// (on a GPU: no host round trip per micro-batch); reduce() brings them to the host in
// one copy. Invariant: every rank holds the same names when it reduces (declare each
// with add_value(name, 0) first, including on a rank that holds no sample).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace slimpi {

class Comm;

class MetricSums {
 public:
  // Σ_t per_token[t] · weight[t], both [N], detached, in f64.
  void add(const std::string& name, const at::Tensor& per_token, const at::Tensor& weight);
  // A 0-dim tensor term (e.g. the loss), detached.
  void add_tensor(const std::string& name, const at::Tensor& value);
  void add_value(const std::string& name, double v) { sums_[name] += v; }
  // Sums over dp ranks (null: this rank alone); returns name -> value.
  std::map<std::string, double> reduce(Comm* dp);

 private:
  std::map<std::string, double> sums_;
  std::map<std::string, at::Tensor> tensor_sums_;  // 0-dim f64, on the model's device
};

}  // namespace slimpi
