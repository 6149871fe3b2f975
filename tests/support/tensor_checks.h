// Comparisons the trainer tests share: a model's tensors (or their gradients) by name,
// and a gtest check that two tensors have one shape and agree to a tolerance, naming the
// largest difference.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/named_tensor.h"

namespace slimpi::testing {

// Copies of the tensors (grads: of their gradients), by name.
inline std::map<std::string, at::Tensor> by_name(const std::vector<NamedTensor>& list, bool grads) {
  std::map<std::string, at::Tensor> m;
  for (const auto& t : list) m[t.name] = grads ? t.tensor.grad().clone() : t.tensor.detach().clone();
  return m;
}

inline void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what, double rtol = 1e-4,
                         double atol = 1e-6) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(at::allclose(got, want, rtol, atol)) << what << ": max |diff| " << (got - want).abs().max().item<double>();
}

}  // namespace slimpi::testing
