#include "train/metric_sums.h"

#include <ATen/ATen.h>

#include <vector>

#include "parallel/comm_tensor.h"

namespace slimpi {

void MetricSums::add(const std::string& name, const at::Tensor& per_token, const at::Tensor& weight) {
  add_tensor(name, (per_token.detach().to(at::kDouble) * weight.detach().to(at::kDouble)).sum());
}

void MetricSums::add_tensor(const std::string& name, const at::Tensor& value) {
  at::Tensor v = value.detach().to(at::kDouble);
  auto it = tensor_sums_.find(name);
  if (it == tensor_sums_.end()) tensor_sums_.emplace(name, v);
  else it->second = it->second + v;
}

std::map<std::string, double> MetricSums::reduce(Comm* dp) {
  if (!tensor_sums_.empty()) {
    std::vector<at::Tensor> parts;
    for (const auto& [k, v] : tensor_sums_) parts.push_back(v.reshape({1}));
    const at::Tensor host = at::cat(parts).cpu();  // [n] f64, one copy
    int64_t i = 0;
    for (const auto& [k, v] : tensor_sums_) sums_[k] += host.data_ptr<double>()[i++];
    tensor_sums_.clear();
  }
  std::vector<double> values;
  for (const auto& [k, v] : sums_) values.push_back(v);
  at::Tensor t = at::tensor(values, at::kDouble);
  if (dp) allreduce(*dp, t);
  std::map<std::string, double> out;
  int64_t i = 0;
  for (const auto& [k, v] : sums_) out[k] = t.data_ptr<double>()[i++];
  return out;
}

}  // namespace slimpi
