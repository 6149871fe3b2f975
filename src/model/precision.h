// Numerical precision of a forward pass (train.precision, rollout.precision).
//   fp32: every op in fp32.
//   bf16: matrix products (linear, matmul) in bf16 through torch's autocast, with
//         weights cast to bf16 as they are used; the residual stream, RMSNorm,
//         softmax, logits and log-probs stay fp32 (model/transformer.h). Training
//         keeps fp32 master weights, gradients and AdamW state (Megatron's mixed
//         precision); a bf16 rollout engine holds bf16 weights and KV cache.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace slimpi {

enum class Precision { FP32, BF16 };

// "fp32" | "bf16" (the deck's choices; anything else is a programming error).
Precision parse_precision(const std::string& name);
const char* precision_name(Precision p);
// Storage dtype of weights held in this precision.
at::ScalarType weight_dtype(Precision p);
// The dtype an engine of rollout.precision `precision` stores its weights in ("fp32",
// "bf16"; "fp8": bf16, holding the de-quantised weights: sync/fp8_weights.h).
at::ScalarType rollout_weight_dtype(const std::string& precision);

// RAII: while alive, forwards on `device` run in precision `p` (bf16: autocast on that
// device type; fp32: autocast off). Restores the previous state; scoped to forwards.
class ForwardPrecision {
 public:
  ForwardPrecision(Precision p, const at::Device& device);
  ~ForwardPrecision();
  ForwardPrecision(const ForwardPrecision&) = delete;
  ForwardPrecision& operator=(const ForwardPrecision&) = delete;

 private:
  at::DeviceType device_type_;
  bool was_enabled_;
  at::ScalarType was_dtype_;
};

}  // namespace slimpi
