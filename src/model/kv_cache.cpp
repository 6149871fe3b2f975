#include "model/kv_cache.h"

#include <slimpi/error.h>

#include <ATen/ATen.h>

#include <algorithm>

#include "kernels/e4m3.h"
#include "model/tensor_shard.h"

namespace slimpi {

KvCache KvCache::allocate(const ModelConfig& cfg, int64_t n_slots, const at::TensorOptions& options,
                          int tensor_parallel, int64_t mtp_layers, bool latent, int64_t n_state_slots) {
  KvCache c;
  const auto [heads, dim, rows] = kv_cache_row(cfg, tensor_parallel, latent);
  c.values_are_keys = rows == 1;
  for (int64_t l = 0; l < cfg.n_layers + std::min(mtp_layers, cfg.mtp_num_layers); ++l) {
    const int64_t layer_heads = l < cfg.n_layers && cfg.is_linear_layer(l) ? 0 : heads;  // (a linear layer caches none)
    c.k.push_back(at::zeros({n_slots, layer_heads, dim}, options));
    c.v.push_back(c.values_are_keys ? c.k.back() : at::zeros({n_slots, layer_heads, dim}, options));
  }
  if (options.dtype() == at::kFloat8_e4m3fn)
    for (size_t l = 0; l < c.k.size(); ++l) {  // the fixed policy: kKvCacheScale per kv head
      c.k_scale.push_back(at::full({heads}, kKvCacheScale, options.dtype(at::kFloat)));
      c.v_scale.push_back(c.values_are_keys ? c.k_scale.back()
                                            : at::full({heads}, kKvCacheScale, options.dtype(at::kFloat)));
    }
  const auto state = options.dtype(at::kFloat);
  const LinearHeads local = cfg.is_hybrid() ? local_linear_heads(cfg, tensor_parallel) : LinearHeads{};  // this rank's
  for (int64_t l = 0; l < cfg.n_layers; ++l)
    if (cfg.is_linear_layer(l)) {
      c.conv_state.push_back(at::zeros({n_state_slots, local.conv_dim, cfg.linear_conv_kernel_dim - 1}, state));
      c.delta_state.push_back(
          at::zeros({n_state_slots, local.value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim}, state));
    }
  if (cfg.n_experts > 0)
    c.routing = at::full({n_slots, cfg.n_moe_layers(), cfg.n_experts_per_tok}, -1, options.dtype(at::kShort));
  return c;
}

namespace {

// x [n, Hkv, D] -> e4m3(clamp(x / scale[h], ±448)).
at::Tensor quantize_rows(const at::Tensor& x, const at::Tensor& scale) {
  return (x.to(at::kFloat) / scale.view({1, -1, 1})).clamp(-448.0, 448.0).to(at::kFloat8_e4m3fn);
}

}  // namespace

at::Tensor kv_storage_values(const at::Tensor& x, at::ScalarType storage) {
  if (storage == at::kFloat) return x.to(at::kFloat);
  if (storage == at::kBFloat16) return x.to(at::kBFloat16).to(at::kFloat);
  SLIMPI_CHECK(storage == at::kFloat8_e4m3fn, "kv_storage_values: a cache of fp32, bf16 or e4m3");
  const at::Tensor scale = at::full({x.size(1)}, kKvCacheScale, x.options().dtype(at::kFloat));
  return quantize_rows(x, scale).to(at::kFloat) * scale.view({1, -1, 1});
}

void KvCache::store(int64_t layer, const at::Tensor& slots, const at::Tensor& keys, const at::Tensor& values) {
  if (quantized()) {
    k[size_t(layer)].view(at::kByte).index_copy_(0, slots, quantize_rows(keys, k_scale[size_t(layer)]).view(at::kByte));
    if (!values_are_keys)
      v[size_t(layer)].view(at::kByte).index_copy_(0, slots,
                                                   quantize_rows(values, v_scale[size_t(layer)]).view(at::kByte));
    return;
  }
  k[size_t(layer)].index_copy_(0, slots, keys.to(k[size_t(layer)].scalar_type()));
  if (!values_are_keys) v[size_t(layer)].index_copy_(0, slots, values.to(v[size_t(layer)].scalar_type()));
}

at::Tensor KvCache::select(int64_t layer, bool key, const at::Tensor& slots, const at::Tensor& out) const {
  const at::Tensor& rows = key ? k[size_t(layer)] : v[size_t(layer)];
  if (!quantized()) {
    if (!out.defined()) return rows.index_select(0, slots);
    at::Tensor o = out;
    at::index_select_out(o, rows, 0, slots);
    return o;
  }
  if (!out.defined()) return rows.view(at::kByte).index_select(0, slots).view(at::kFloat8_e4m3fn);
  at::Tensor bytes = out.view(at::kByte);
  at::index_select_out(bytes, rows.view(at::kByte), 0, slots);
  return out;
}

at::Tensor KvCache::decoded(const at::Tensor& rows, int64_t layer, bool key, at::ScalarType dtype) const {
  if (!quantized()) return rows.to(dtype);
  const at::Tensor& scale = key ? k_scale[size_t(layer)] : v_scale[size_t(layer)];
  if (rows.device().is_cpu() && rows.is_contiguous() && (dtype == at::kFloat || dtype == at::kBFloat16)) {
    // One vectorised pass (kernels/e4m3.h): the same numbers as the torch ops below.
    const int64_t Hkv = rows.size(-2), D = rows.size(-1), n = rows.numel() / std::max<int64_t>(1, Hkv * D);
    at::Tensor out = at::empty(rows.sizes(), rows.options().dtype(dtype));
    const at::Tensor s = scale.to(at::kFloat).contiguous();
    const uint8_t* codes = static_cast<const uint8_t*>(rows.data_ptr());
    if (dtype == at::kFloat)
      e4m3_rows_to_float(codes, n, Hkv, D, s.data_ptr<float>(), out.data_ptr<float>());
    else
      e4m3_rows_to_bf16(codes, n, Hkv, D, s.data_ptr<float>(), out.data_ptr<c10::BFloat16>());
    return out;
  }
  std::vector<int64_t> shape(size_t(rows.dim()), 1);
  shape[size_t(rows.dim()) - 2] = -1;  // the kv-head axis
  return (rows.to(at::kFloat) * scale.view(shape)).to(dtype);
}

void KvCache::copy_state(int64_t from, int64_t to) {
  for (auto* states : {&conv_state, &delta_state})
    for (at::Tensor& s : *states) s.select(0, to).copy_(s.select(0, from));
}

int64_t KvCache::state_bytes_per_sequence() const {
  int64_t bytes = 0;
  for (const auto* states : {&conv_state, &delta_state})
    for (const at::Tensor& s : *states) bytes += s[0].numel() * int64_t(s.element_size());
  return bytes;
}

int64_t KvCache::bytes_per_token() const {
  int64_t bytes = 0;
  for (size_t l = 0; l < k.size(); ++l) {
    bytes += (k[l].numel() / std::max<int64_t>(1, n_slots())) * int64_t(k[l].element_size());
    if (!values_are_keys) bytes += (v[l].numel() / std::max<int64_t>(1, n_slots())) * int64_t(v[l].element_size());
  }
  return bytes;
}

}  // namespace slimpi
