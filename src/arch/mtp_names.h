// Multi-token-prediction tensors in DeepSeek-V3's file layout: depth i of a model of L
// layers is "model.layers.<L + i>." (as DeepSeek-V3 and GLM-4.5 store their MTP modules),
// beside slimpi's (and MiMo's) "model.mtp_layers.<i>.":
//   slimpi / MiMo                        DeepSeek-V3
//   token_layernorm.weight               enorm.weight
//   hidden_layernorm.weight              hnorm.weight
//   input_proj.weight [d, 2d]            eh_proj.weight [d, 2d], its column halves swapped
//                                        (DeepSeek concatenates [embedding ; hidden],
//                                        MiMo [hidden ; embedding])
//   final_layernorm.weight               shared_head.norm.weight
//   the layer's own tensors              the same names
// Qwen3.5 and Qwen3-Next store their one MTP depth as "mtp.*" (their input projection,
// norms and final norm shared by every depth when there are several; slimpi reads and
// writes one):
//   token_layernorm.weight               mtp.pre_fc_norm_embedding.weight
//   hidden_layernorm.weight              mtp.pre_fc_norm_hidden.weight
//   input_proj.weight [d, 2d]            mtp.fc.weight ([embedding ; hidden], as DeepSeek)
//   final_layernorm.weight               mtp.norm.weight
//   the layer's own tensors              mtp.layers.0.<the same names>
// DeepSeek's files also hold each depth's copies of the shared embedding and head
// ("embed_tokens.weight", "shared_head.head.weight"); slimpi reads its own shared ones
// and writes no copies. Used by Hugging Face import (io/tensor_io) and export
// (ckpt/hf_export): a family's Architecture::mtp_layout says which it writes. Stateless.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace slimpi {

// Whether `name` is an MTP depth's tensor in slimpi's names.
bool is_mtp_parameter(const std::string& name);
// slimpi's `name` (an MTP depth's) in DeepSeek-V3's layout for a model of n_layers layers.
std::string deepseek_mtp_name(const std::string& name, int64_t n_layers);
// Whether a checkpoint's tensor names are DeepSeek-V3's MTP layout ("*.eh_proj.weight").
bool uses_deepseek_mtp_names(const std::vector<std::string>& file_tensor_names);
// slimpi's `name` (depth 0's) in Qwen3.5's layout; depth > 0 is an error.
std::string qwen_mtp_name(const std::string& name);
// Whether a checkpoint's tensor names are Qwen3.5's MTP layout ("mtp.fc.weight").
bool uses_qwen_mtp_names(const std::vector<std::string>& file_tensor_names);
// Whether a DeepSeek-V3 file tensor is one of the MTP depths' copies of the shared
// embedding or head (read from the trunk instead).
bool is_deepseek_mtp_copy(const std::string& file_name);
// An input projection [d, 2d] with its column halves swapped (either direction).
at::Tensor swap_input_proj_halves(const at::Tensor& w);
// Whether slimpi's `name` is an input projection (its values differ between the layouts).
bool is_mtp_input_proj(const std::string& name);

}  // namespace slimpi
