// The order of a Gated DeltaNet layer's convolved q/k/v channels (in_proj_qkv's rows and
// conv1d's channels; ModelConfig::linear_conv_dim() of them) as slimpi holds them, and
// the conversion to and from Hugging Face's order.
//
// Hugging Face (Qwen3.5, Qwen3-Next's conv1d) orders them queries, keys, values:
//   [q_0 .. q_{Hk-1} | k_0 .. k_{Hk-1} | v_0 .. v_{Hv-1}]        (q_i, k_i Dk rows; v_j Dv)
// slimpi groups them by key head i, with the r = Hv / Hk value heads that read it:
//   [q_0 k_0 v_0 .. v_{r-1} | q_1 k_1 v_r .. v_{2r-1} | ...]      (2·Dk + r·Dv rows a group)
// so that a tensor-parallel split by key heads is one contiguous run of rows
// (model/tensor_shard.h), as Qwen3-Next's fused in_proj_qkvz already is. Loading a
// Hugging Face checkpoint converts (io/tensor_io.cpp), exporting converts back
// (ckpt/hf_export.cpp); slimpi's own checkpoints hold slimpi's order and say so
// (the "linear_channels" attribute of their model group).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace slimpi {

struct ModelConfig;

// Whether parameter `name` holds convolved q/k/v channels along dim 0 in the two orders
// above (a hybrid model's in_proj_qkv and conv1d; Qwen3-Next's in_proj_qkvz is grouped
// in its files too, and is not converted).
bool holds_linear_channels(const std::string& name, const ModelConfig& cfg);

// rows [C, ...] in Hugging Face's order -> slimpi's, and back (new tensors).
at::Tensor linear_channels_from_hf(const at::Tensor& rows, const ModelConfig& cfg);
at::Tensor linear_channels_to_hf(const at::Tensor& rows, const ModelConfig& cfg);

// The attribute a model group of slimpi's HDF5 checkpoints carries when its hybrid
// layers' channels are in slimpi's order, and its value.
inline constexpr const char* kLinearChannelsAttr = "linear_channels";
inline constexpr const char* kLinearChannelsByKeyHead = "grouped_by_key_head";

}  // namespace slimpi
