#include "model/exact_ops.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include "kernels/batch_invariant.h"
#include "model/gated_delta_rule.h"
#include "model/log_probs.h"
#include "model/recompute.h"

namespace slimpi {
namespace {

using Tensors = std::vector<at::Tensor>;

// The kernels' operands: fp32 host tensors (a bf16 forward's tensors widened, exactly).
at::Tensor fp32(const at::Tensor& t) { return t.to(at::kFloat); }

// kernel(the inputs in fp32) rounded to `dtype` (the dtype ATen's op gives: a bf16
// forward's bf16) as the value; under autograd, reference's gradient.
template <class Kernel, class Reference>
at::Tensor exact_value(Kernel kernel, Reference reference, const Tensors& inputs, at::ScalarType dtype) {
  return value_with_gradient_of(
      [kernel, dtype](const Tensors& in) {
        Tensors wide;
        for (const at::Tensor& t : in) wide.push_back(fp32(t));
        return Tensors{kernel(wide).to(dtype)};
      },
      [reference](const Tensors& in) { return Tensors{reference(in)}; }, inputs)[0];
}

at::ScalarType promoted(const at::Tensor& a, const at::Tensor& b) {
  return at::promote_types(a.scalar_type(), b.scalar_type());
}

at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& w, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor r = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (xf * r).to(x.scalar_type()) * w;
}

at::Tensor normalize_reference(const at::Tensor& x, double eps) {
  return eps != 0.0 ? x / (x.sum(-1, true) + eps) : x / x.sum(-1, true);
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  if (!exact_numerics()) return rms_norm_reference(x, w, eps);
  return exact_value([eps](const Tensors& in) { return rms_norm_rows(in[0], in[1], eps); },
                     [eps](const Tensors& in) { return rms_norm_reference(in[0], in[1], eps); }, {x, w},
                     promoted(x, w));
}

at::Tensor swiglu(const at::Tensor& g, const at::Tensor& u) {
  if (!exact_numerics()) return at::silu(g) * u;
  return exact_value([](const Tensors& in) { return silu_mul_elementwise(in[0], in[1]); },
                     [](const Tensors& in) { return at::silu(in[0]) * in[1]; }, {g, u}, promoted(g, u));
}

at::Tensor sigmoid_of(const at::Tensor& x) {
  if (!exact_numerics()) return at::sigmoid(x);
  return exact_value([](const Tensors& in) { return sigmoid_elementwise(in[0]); },
                     [](const Tensors& in) { return at::sigmoid(in[0]); }, {x}, x.scalar_type());
}

at::Tensor silu_of(const at::Tensor& x) {
  if (!exact_numerics()) return at::silu(x);
  return exact_value([](const Tensors& in) { return silu_elementwise(in[0]); },
                     [](const Tensors& in) { return at::silu(in[0]); }, {x}, x.scalar_type());
}

at::Tensor softplus_of(const at::Tensor& x) {
  if (!exact_numerics()) return at::softplus(x);
  return exact_value([](const Tensors& in) { return softplus_elementwise(in[0]); },
                     [](const Tensors& in) { return at::softplus(in[0]); }, {x}, x.scalar_type());
}

at::Tensor l2_normalize_last(const at::Tensor& x, double eps) {
  auto reference = [eps](const at::Tensor& t) { return t * at::rsqrt(t.pow(2).sum(-1, true) + eps); };
  if (!exact_numerics()) return reference(x);
  return exact_value([eps](const Tensors& in) { return l2_normalize_rows(in[0], eps); },
                     [reference](const Tensors& in) { return reference(in[0]); }, {x}, x.scalar_type());
}

at::Tensor gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                            const at::Tensor& beta, const at::Tensor& initial_state, at::Tensor* final_state,
                            bool one_token_steps) {
  if (!exact_numerics())
    return one_token_steps ? gated_delta_rule_recurrent(q, k, v, g, beta, initial_state, final_state)
                           : gated_delta_rule_chunked(q, k, v, g, beta, initial_state, final_state);
  Tensors inputs{q, k, v, g, beta};
  if (initial_state.defined()) inputs.push_back(initial_state);
  const bool with_state = final_state != nullptr;  // (a training pass needs the outputs only)
  const Tensors out = value_with_gradient_of(
      [with_state](const Tensors& in) {
        at::Tensor last;
        Tensors wide;
        for (const at::Tensor& t : in) wide.push_back(fp32(t));
        const at::Tensor o = gated_delta_rule_rows(wide[0], wide[1], wide[2], wide[3], wide[4],
                                                   wide.size() > 5 ? wide[5] : at::Tensor(), &last);
        return with_state ? Tensors{o.to(in[2].scalar_type()), last} : Tensors{o.to(in[2].scalar_type())};
      },
      [with_state](const Tensors& in) {
        at::Tensor last;
        const at::Tensor o = gated_delta_rule_chunked(in[0], in[1], in[2], in[3], in[4],
                                                      in.size() > 5 ? in[5] : at::Tensor(), with_state ? &last : nullptr);
        return with_state ? Tensors{o, last.to(at::kFloat)} : Tensors{o};
      },
      inputs);
  if (final_state) *final_state = out[1];
  return out[0];
}

at::Tensor softmax_last(const at::Tensor& x) {
  if (!exact_numerics()) return at::softmax(x, -1);
  return exact_value([](const Tensors& in) { return softmax_rows(in[0]); },
                     [](const Tensors& in) { return at::softmax(in[0], -1); }, {x}, x.scalar_type());
}

at::Tensor normalize_last(const at::Tensor& x, double eps) {
  if (!exact_numerics()) return normalize_reference(x, eps);
  return exact_value([eps](const Tensors& in) { return normalize_rows(in[0], eps); },
                     [eps](const Tensors& in) { return normalize_reference(in[0], eps); }, {x}, x.scalar_type());
}

at::Tensor sampled_token_log_probs(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& targets,
                                   const at::Tensor& support) {
  auto reference = [targets, support](const at::Tensor& z, const at::Tensor& t) {
    return log_probs_over_support(z.to(at::kFloat) / t.to(z.device()).unsqueeze(1), targets, support);
  };
  if (!exact_numerics()) return reference(logits, temperature);
  return exact_value([targets, support](const Tensors& in) { return token_log_probs_rows(in[0], in[1], targets, support); },
                     [reference](const Tensors& in) { return reference(in[0], in[1]); }, {logits, temperature},
                     at::kFloat);
}

}  // namespace slimpi
