// Architecture — one Hugging Face model family (a config.json `model_type`) as slimpi
// reads, runs and writes it: one registry entry per family, each in its own file
// (arch/<model_type>.cpp), holding
//   * its names: model_type and the transformers class (config.json's "architectures"),
//   * config.json in: the deck keys the family decides (biases, q/k norms, the MoE
//     fields) beyond the fields every family has (config/hf_config.cpp),
//   * which slimpi models export as it (fits), and config.json out: its own fields
//     beyond the common ones (ckpt/hf_export.cpp),
//   * its tensor names: the file name of each slimpi parameter (slimpi names tensors as
//     Llama / Qwen do; Mixtral names its MoE tensors its own way).
// The model itself (model/transformer.h) is one implementation for every family; a
// family is a set of deck keys for it. Adding a family: one file and one add() in
// architectures(). Stateless; built once.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/registry.h"

namespace slimpi {

struct HfConfigReader;
struct ModelConfig;

struct Architecture {
  const char* model_type;  // "qwen2"
  const char* hf_class;    // "Qwen2ForCausalLM"
  bool moe;                // a mixture-of-experts family
  // config.json -> the family's deck keys.
  void (*read_config)(const nlohmann::json& config, HfConfigReader& r);
  // Whether a slimpi model exports as this family (at most one family fits a model).
  bool (*fits)(const ModelConfig& cfg);
  // The family's config.json fields beyond the common ones.
  void (*write_config)(const ModelConfig& cfg, nlohmann::json& j);
  // The file name of slimpi's tensor `name`, and the text that marks the files of this
  // family's naming (null: slimpi's names, nothing to translate).
  std::string (*tensor_name)(const std::string& name) = nullptr;
  const char* file_marker = nullptr;
  // The text that names a routed expert's tensor in this family's files.
  const char* expert_marker = ".mlp.experts.";
  // How the family's files name multi-token-prediction depths (arch/mtp_names.h):
  // DeepSeek-V3's "model.layers.<L + i>." (the default), slimpi's own "model.mtp_layers.<i>."
  // (MiMo), or Qwen3.5's "mtp.*" (one depth).
  enum class MtpLayout { DeepSeek, Slimpi, Qwen };
  MtpLayout mtp_layout = MtpLayout::DeepSeek;
  // Whether the family's MoE layers are DeepSeekMoE's (sigmoid router, shared experts,
  // dense first layers) and its attention may rotate part of each head; the other
  // families never export a model with any of these (ModelConfig::uses_deepseek_features).
  bool deepseek_moe = false;
  // Hybrid linear attention (Gated DeltaNet layers; ModelConfig::is_hybrid): such families
  // export only hybrid models, the others never one.
  bool hybrid = false;
  // config.json holds the text model's fields in "text_config" (a multimodal class whose
  // text model slimpi runs); "architectures" stays the top level's.
  bool nested_text_config = false;
  // Every layer sparse (Qwen3.5-MoE): config.json may leave out intermediate_size.
  bool no_dense_layers = false;
  // Tensors of this family's files that the text model does not take (a vision tower,
  // MTP layers slimpi does not read): skipped on load, counted in one log line.
  bool (*not_loaded)(const std::string& file_name) = nullptr;
  // The shape slimpi's tensor `name` of shape `shape` has in this family's files where it
  // differs (a depthwise conv1d's unit dimension: [C, K] -> [C, 1, K]); null: the same.
  std::vector<int64_t> (*file_shape)(const std::string& name, const std::vector<int64_t>& shape) = nullptr;
};

// Keyed by model_type.
const Registry<Architecture>& architectures();

// The family of a config.json: by its "architectures" class, else by model_type
// (null: none slimpi implements).
const Architecture* architecture_of_config(const std::string& hf_class, const std::string& model_type);
// The family a model exports as (null: none fits it).
const Architecture* export_architecture(const ModelConfig& cfg);
// The family whose tensor naming a checkpoint's names use (null: slimpi's own).
const Architecture* architecture_naming(const std::vector<std::string>& file_tensor_names);
// Whether a file's tensor name is a routed expert's (in any family's naming).
bool is_hf_expert_name(const std::string& name);
// "LlamaForCausalLM, Qwen2ForCausalLM, ..." (in registry order), for messages.
std::string architecture_classes(bool moe_only = false);

// The families' entries (one per file).
Architecture llama_architecture();
Architecture qwen2_architecture();
Architecture qwen3_architecture();
Architecture qwen2_moe_architecture();
Architecture qwen3_moe_architecture();
Architecture mixtral_architecture();
Architecture mimo_architecture();
Architecture glm4_moe_architecture();
Architecture deepseek_v3_architecture();
Architecture glm4_moe_lite_architecture();
Architecture qwen3_5_architecture();
Architecture qwen3_5_text_architecture();
Architecture qwen3_5_moe_architecture();
Architecture qwen3_5_moe_text_architecture();
Architecture qwen3_next_architecture();

// Readers and writers several families share (arch/shared_fields.cpp).
// attention_bias: q/k/v and o biases alike (Llama, Qwen3).
void read_attention_bias(const nlohmann::json& c, HfConfigReader& r);
// A dense family: expert fields in its config are a problem.
void refuse_experts(const nlohmann::json& c, HfConfigReader& r);
// Qwen2-MoE / Qwen3-MoE expert fields (num_experts or num_local_experts, ...).
void read_qwen_moe(const nlohmann::json& c, HfConfigReader& r);
void write_qwen_moe(const ModelConfig& cfg, nlohmann::json& j);
// partial_rotary_factor, in rope_parameters (transformers 5) or at the top level, with the
// field it came from (nullopt: neither has it); read as the deck key, `absent` when neither.
std::optional<std::pair<double, const char*>> find_partial_rotary_factor(const nlohmann::json& c);
void read_partial_rotary_factor(const nlohmann::json& c, HfConfigReader& r, double absent);
// DeepSeekMoE's fields (n_routed_experts, n_group, topk_group, routed_scaling_factor,
// n_shared_experts, first_k_dense_replace, ...; arch/glm4_moe.cpp), in and out.
// absent: the transformers config class's defaults for fields config.json leaves out.
struct DeepSeekMoeDefaults {
  double routed_scaling_factor;
  int64_t n_group, topk_group, first_k_dense_replace;
};
void read_deepseek_moe(const nlohmann::json& c, HfConfigReader& r, const DeepSeekMoeDefaults& absent);
void write_deepseek_moe(const ModelConfig& cfg, nlohmann::json& j);
bool is_deepseek_moe(const ModelConfig& cfg);

}  // namespace slimpi
