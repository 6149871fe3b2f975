#include "model/exact_ops.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include "kernels/batch_invariant.h"
#include "model/log_probs.h"
#include "model/recompute.h"

namespace slimpi {
namespace {

// exact(inputs) as the value; under autograd, reference's gradient.
at::Tensor exact_value(const RecomputedBlock& exact, const RecomputedBlock& reference,
                       const std::vector<at::Tensor>& inputs) {
  return value_with_gradient_of(exact, reference, inputs)[0];
}

at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& w, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor r = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (xf * r).to(x.scalar_type()) * w;
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  if (!exact_numerics()) return rms_norm_reference(x, w, eps);
  return exact_value([eps](const std::vector<at::Tensor>& in) { return std::vector{rms_norm_rows(in[0], in[1], eps)}; },
                     [eps](const std::vector<at::Tensor>& in) { return std::vector{rms_norm_reference(in[0], in[1], eps)}; },
                     {x, w});
}

at::Tensor swiglu(const at::Tensor& g, const at::Tensor& u) {
  if (!exact_numerics()) return at::silu(g) * u;
  return exact_value([](const std::vector<at::Tensor>& in) { return std::vector{silu_mul_elementwise(in[0], in[1])}; },
                     [](const std::vector<at::Tensor>& in) { return std::vector{at::silu(in[0]) * in[1]}; }, {g, u});
}

at::Tensor sigmoid_of(const at::Tensor& x) {
  if (!exact_numerics()) return at::sigmoid(x);
  return exact_value([](const std::vector<at::Tensor>& in) { return std::vector{sigmoid_elementwise(in[0])}; },
                     [](const std::vector<at::Tensor>& in) { return std::vector{at::sigmoid(in[0])}; }, {x});
}

at::Tensor softmax_last(const at::Tensor& x) {
  if (!exact_numerics()) return at::softmax(x, -1);
  return exact_value([](const std::vector<at::Tensor>& in) { return std::vector{softmax_rows(in[0])}; },
                     [](const std::vector<at::Tensor>& in) { return std::vector{at::softmax(in[0], -1)}; }, {x});
}

at::Tensor normalize_last(const at::Tensor& x, double eps) {
  auto reference = [eps](const at::Tensor& t) { return eps != 0.0 ? t / (t.sum(-1, true) + eps) : t / t.sum(-1, true); };
  if (!exact_numerics()) return reference(x);
  return exact_value([eps](const std::vector<at::Tensor>& in) { return std::vector{normalize_rows(in[0], eps)}; },
                     [reference](const std::vector<at::Tensor>& in) { return std::vector{reference(in[0])}; }, {x});
}

at::Tensor sampled_token_log_probs(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& targets,
                                   const at::Tensor& support) {
  auto reference = [targets, support](const at::Tensor& z, const at::Tensor& t) {
    return log_probs_over_support(z.to(at::kFloat) / t.to(z.device()).unsqueeze(1), targets, support);
  };
  if (!exact_numerics()) return reference(logits, temperature);
  return exact_value(
      [targets, support](const std::vector<at::Tensor>& in) {
        return std::vector{token_log_probs_rows(in[0], in[1], targets, support)};
      },
      [reference](const std::vector<at::Tensor>& in) { return std::vector{reference(in[0], in[1])}; },
      {logits, temperature});
}

}  // namespace slimpi
