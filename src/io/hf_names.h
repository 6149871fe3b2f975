// Hugging Face tensor names that differ by architecture. slimpi names a model's tensors
// as Llama / Qwen do (its parameter list, checkpoints); Mixtral names the MoE tensors its
// own way, and loading and export translate:
//   model.layers.<l>.mlp.gate.weight                 <-> model.layers.<l>.block_sparse_moe.gate.weight
//   model.layers.<l>.mlp.experts.<e>.gate_proj.weight <-> ...block_sparse_moe.experts.<e>.w1.weight
//   ...mlp.experts.<e>.up_proj.weight                 <-> ...block_sparse_moe.experts.<e>.w3.weight
//   ...mlp.experts.<e>.down_proj.weight               <-> ...block_sparse_moe.experts.<e>.w2.weight
#pragma once

#include <string>

namespace slimpi {

// Mixtral's name for the tensor slimpi calls `name` (the same name when Mixtral has no other).
std::string mixtral_name(const std::string& name);
// Whether a file's tensor name is a routed expert's (either naming).
bool is_hf_expert_name(const std::string& name);

}  // namespace slimpi
