#include "model/precision.h"

#include <ATen/autocast_mode.h>
#include <slimpi/error.h>

namespace slimpi {

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::FP32;
  if (name == "bf16") return Precision::BF16;
  SLIMPI_FAIL("unknown precision '{}' (fp32 | bf16)", name);
}

const char* precision_name(Precision p) { return p == Precision::BF16 ? "bf16" : "fp32"; }

at::ScalarType weight_dtype(Precision p) { return p == Precision::BF16 ? at::kBFloat16 : at::kFloat; }

at::ScalarType rollout_weight_dtype(const std::string& precision) {
  return precision == "fp8" ? at::kBFloat16 : weight_dtype(parse_precision(precision));
}

ForwardPrecision::ForwardPrecision(Precision p, const at::Device& device)
    : device_type_(device.type()),
      was_enabled_(at::autocast::is_autocast_enabled(device_type_)),
      was_dtype_(at::autocast::get_autocast_dtype(device_type_)) {
  at::autocast::set_autocast_enabled(device_type_, p == Precision::BF16);
  at::autocast::set_autocast_dtype(device_type_, at::kBFloat16);
  at::autocast::increment_nesting();
}

ForwardPrecision::~ForwardPrecision() {
  // Leaving the outermost region drops the cached bf16 copies of the weights: the next
  // forward (after an optimizer step) casts the updated masters again.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, was_enabled_);
  at::autocast::set_autocast_dtype(device_type_, was_dtype_);
}

}  // namespace slimpi
