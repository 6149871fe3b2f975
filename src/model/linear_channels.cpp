#include "model/linear_channels.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include "model/model_config.h"

namespace slimpi {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// rows [C, ...] as [C, R] (R: the trailing dimensions' product), checked against cfg.
at::Tensor as_matrix(const at::Tensor& rows, const ModelConfig& cfg) {
  SLIMPI_CHECK(rows.dim() >= 1 && rows.size(0) == cfg.linear_conv_dim(), "a Gated DeltaNet layer's q/k/v channels: "
               "{} rows, the model has {}", rows.dim() >= 1 ? rows.size(0) : 0, cfg.linear_conv_dim());
  return rows.reshape({rows.size(0), -1});
}

}  // namespace

bool holds_linear_channels(const std::string& name, const ModelConfig& cfg) {
  if (!cfg.is_hybrid()) return false;
  if (ends_with(name, ".linear_attn.conv1d.weight")) return true;
  return !cfg.linear_fused_projections && ends_with(name, ".linear_attn.in_proj_qkv.weight");
}

at::Tensor linear_channels_from_hf(const at::Tensor& rows, const ModelConfig& cfg) {
  const int64_t Hk = cfg.linear_num_key_heads, Dk = cfg.linear_key_head_dim;
  const int64_t vr = cfg.linear_value_dim() / Hk;  // a key head's value rows: (Hv / Hk)·Dv
  const at::Tensor m = as_matrix(rows, cfg);       // [C, R]
  const int64_t R = m.size(1);
  const at::Tensor q = m.narrow(0, 0, Hk * Dk).view({Hk, Dk, R});
  const at::Tensor k = m.narrow(0, Hk * Dk, Hk * Dk).view({Hk, Dk, R});
  const at::Tensor v = m.narrow(0, 2 * Hk * Dk, Hk * vr).view({Hk, vr, R});
  return at::cat({q, k, v}, 1).reshape(rows.sizes());  // [Hk, 2·Dk + vr, R] -> [C, ...]
}

at::Tensor linear_channels_to_hf(const at::Tensor& rows, const ModelConfig& cfg) {
  const int64_t Hk = cfg.linear_num_key_heads, Dk = cfg.linear_key_head_dim;
  const int64_t vr = cfg.linear_value_dim() / Hk;
  const at::Tensor m = as_matrix(rows, cfg);
  const at::Tensor g = m.view({Hk, 2 * Dk + vr, m.size(1)});  // [Hk, 2·Dk + vr, R]
  auto part = [&](int64_t from, int64_t n) { return g.narrow(1, from, n).reshape({Hk * n, m.size(1)}); };
  return at::cat({part(0, Dk), part(Dk, Dk), part(2 * Dk, vr)}, 0).reshape(rows.sizes());
}

}  // namespace slimpi
