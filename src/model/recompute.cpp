#include "model/recompute.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

namespace slimpi {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The block and the autocast state of its forward, kept in the autograd context.
struct BlockHolder : torch::CustomClassHolder {
  RecomputedBlock block;     // run in forward, without autograd
  RecomputedBlock gradient;  // run again in backward, with autograd (null: block)
  c10::DeviceType device = c10::DeviceType::CPU;
  bool autocast = false;
  at::ScalarType autocast_dtype = at::kFloat;
};

struct Recompute : public torch::autograd::Function<Recompute> {
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<BlockHolder> holder, at::TensorList inputs) {
    ctx->saved_data["block"] = c10::IValue::make_capsule(holder);
    ctx->save_for_backward(inputs.vec());
    at::NoGradGuard no_grad;
    return holder->block(inputs.vec());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<BlockHolder>(ctx->saved_data["block"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    for (const auto& x : saved) inputs.push_back(x.detach().requires_grad_(x.requires_grad()));
    variable_list outputs;
    {
      at::AutoGradMode grad(true);
      // The forward's autocast (a bf16 trainer) for the second run.
      const bool was = at::autocast::is_autocast_enabled(holder->device);
      const at::ScalarType was_dtype = at::autocast::get_autocast_dtype(holder->device);
      at::autocast::set_autocast_enabled(holder->device, holder->autocast);
      if (holder->autocast) at::autocast::set_autocast_dtype(holder->device, holder->autocast_dtype);
      outputs = holder->gradient ? holder->gradient(inputs) : holder->block(inputs);
      at::autocast::set_autocast_enabled(holder->device, was);
      at::autocast::set_autocast_dtype(holder->device, was_dtype);
    }
    variable_list with_grad_out, with_grad;
    for (size_t i = 0; i < outputs.size(); ++i)
      if (outputs[i].requires_grad() && grads[i].defined()) {
        with_grad_out.push_back(outputs[i]);
        with_grad.push_back(grads[i]);
      }
    if (!with_grad_out.empty()) torch::autograd::backward(with_grad_out, with_grad);
    variable_list out{at::Tensor()};  // the holder
    for (const auto& x : inputs) out.push_back(x.requires_grad() ? x.grad() : at::Tensor());
    return out;
  }
};

}  // namespace

std::vector<at::Tensor> recomputed(RecomputedBlock block, const std::vector<at::Tensor>& inputs) {
  return value_with_gradient_of(std::move(block), nullptr, inputs);
}

std::vector<at::Tensor> value_with_gradient_of(RecomputedBlock value, RecomputedBlock gradient,
                                               const std::vector<at::Tensor>& inputs) {
  SLIMPI_CHECK(!inputs.empty(), "recomputed: a block without inputs");
  // No input to differentiate: the block's values alone, no autograd node (what the node
  // would give: outputs without gradients).
  const bool any_grad = at::GradMode::is_enabled() && std::any_of(inputs.begin(), inputs.end(), [](const at::Tensor& x) {
                          return x.defined() && x.requires_grad();
                        });
  if (!any_grad) {
    at::NoGradGuard no_grad;
    return value(inputs);
  }
  auto holder = c10::make_intrusive<BlockHolder>();
  holder->block = std::move(value);
  holder->gradient = std::move(gradient);
  holder->device = inputs.front().device().type();
  holder->autocast = at::autocast::is_autocast_enabled(holder->device);
  holder->autocast_dtype = at::autocast::get_autocast_dtype(holder->device);
  return Recompute::apply(holder, at::TensorList(inputs));
}

}  // namespace slimpi
