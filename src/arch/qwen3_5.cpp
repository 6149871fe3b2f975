// Qwen3.5 (Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration) and their
// text models alone (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM): hybrid linear attention,
// three of every four layers Gated DeltaNet (model/transformer_linear.cpp) and the fourth
// Qwen3-Next's gated full attention (q/k norms, an output gate from q_proj, a quarter of
// each head rotated), zero-centred RMSNorms; the MoE variant's every layer a softmax-routed
// MoE (top-k renormalised) with a sigmoid-gated shared expert.
//   * The Hub's checkpoints are the multimodal class: the text model's fields are its
//     config.json's text_config, its tensors "model.language_model.*"; the vision tower
//     ("model.visual.*") is not loaded (one log line), nor are the MTP layers ("mtp.*")
//     unless the model has an MTP depth (mtp_num_hidden_layers; arch/mtp_names.h).
//   * Their RoPE is multimodal (mrope_section over three position axes); a text token has
//     the same position on all three, where it is ordinary RoPE over the rotary dims.
//   * A model exports as the text class (config.json without text_config, "model.*"
//     tensors), which transformers loads as it is.
// Qwen3NextForCausalLM (Qwen3-Next, their predecessor) shares this file: the same layers
// with the DeltaNet projections fused per key head (in_proj_qkvz, in_proj_ba;
// model.linear_fused_projections) and Qwen3-MoE's fields (decoder_sparse_step,
// norm_topk_prob; dense layers between sparse ones), a gated shared expert.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "arch/architecture.h"
#include "arch/hf_config_reader.h"
#include "model/model_config.h"

namespace slimpi {
namespace {

// layer_types as full_attention_interval: every interval-th layer full attention, the
// rest linear (the only pattern Qwen3.5 and Qwen3-Next ship).
void read_layer_types(const nlohmann::json& c, HfConfigReader& r) {
  auto it = c.find("layer_types");
  if (it == c.end() || it->is_null()) {
    const int64_t interval = get_int(c, "full_attention_interval").value_or(4);
    if (interval < 1) r.fail("'full_attention_interval' = {} must be positive", interval);
    else r.set("model.full_attention_interval", interval,
               c.contains("full_attention_interval") ? "full_attention_interval" : "architectures (its default 4)");
    return;
  }
  int64_t interval = 0;
  bool ok = it->is_array() && !it->empty();
  if (ok && get_int(c, "num_hidden_layers") && int64_t(it->size()) != *get_int(c, "num_hidden_layers")) {
    r.fail("layer_types has {} entries for num_hidden_layers = {}", it->size(), *get_int(c, "num_hidden_layers"));
    return;
  }
  for (size_t l = 0; ok && l < it->size(); ++l) {
    const nlohmann::json& t = (*it)[l];
    if (t == "full_attention" && interval == 0) interval = int64_t(l) + 1;
    ok = t == "linear_attention" || t == "full_attention";
  }
  for (size_t l = 0; ok && interval > 0 && l < it->size(); ++l)
    ok = ((*it)[l] == "full_attention") == ((int64_t(l) + 1) % interval == 0);
  if (!ok || interval <= 1)  // (interval 1: no linear layer; none: no full-attention layer)
    r.fail("layer_types = {} is not supported: linear_attention layers with every n-th layer (n > 1) full_attention",
           it->dump());
  else
    r.set("model.full_attention_interval", interval, "layer_types");
}

// The MTP depth: the files' first (their depths share one input projection and norms, and
// slimpi's depths each have their own: the others are not read, io/tensor_io.cpp); whether
// it has its own embedding (not supported).
void read_mtp(const nlohmann::json& c, HfConfigReader& r) {
  if (auto n = get_int(c, "mtp_num_hidden_layers"); n && *n > 1)
    r.set("model.mtp_num_layers", int64_t(1),
          fmt::format("mtp_num_hidden_layers = {}: the first, mtp.layers.0 (the others share its input projection "
                      "and norms, which slimpi's depths do not)", *n));
  if (auto own = get_bool(c, "mtp_use_dedicated_embeddings"); own && *own)
    r.fail("'mtp_use_dedicated_embeddings' = true: an MTP depth with its own embedding is not implemented (slimpi's "
           "read the trunk's)");
}

void write_mtp(const ModelConfig& cfg, nlohmann::json& j) {
  if (cfg.mtp_num_layers > 0) j["mtp_num_hidden_layers"] = cfg.mtp_num_layers;
}

void read_hybrid(const nlohmann::json& c, HfConfigReader& r) {
  read_mtp(c, r);
  if (!get_int(c, "head_dim")) r.set("model.head_dim", int64_t(256), "head_dim (Qwen3.5's default)");
  read_attention_bias(c, r);
  r.set("model.qk_norm", true, "architectures (Qwen3.5: q_norm/k_norm)");
  r.set("model.attn_output_gate", true, "architectures (Qwen3.5: gated attention)");
  r.set("model.zero_centered_norm", true, "architectures (Qwen3.5: RMSNorm applied as 1 + w)");
  read_partial_rotary_factor(c, r, 0.25);
  read_layer_types(c, r);
  r.required(c, "linear_num_key_heads", "model.linear_num_key_heads");
  r.required(c, "linear_num_value_heads", "model.linear_num_value_heads");
  r.required(c, "linear_key_head_dim", "model.linear_key_head_dim");
  r.required(c, "linear_value_head_dim", "model.linear_value_head_dim");
  if (auto k = get_int(c, "linear_conv_kernel_dim"); k && *k < 2) r.fail("'linear_conv_kernel_dim' = {} must be at least 2", *k);
  else r.set("model.linear_conv_kernel_dim", k.value_or(4), k ? "linear_conv_kernel_dim" : "architectures (default 4)");
}

// Qwen3.5-MoE: every layer sparse, top-k always renormalised, a gated shared expert.
void read_hybrid_moe(const nlohmann::json& c, HfConfigReader& r) {
  r.required(c, "num_experts", "model.n_experts");
  r.required(c, "num_experts_per_tok", "model.n_experts_per_tok");
  r.required(c, "moe_intermediate_size", "model.moe_intermediate_size");
  r.required(c, "shared_expert_intermediate_size", "model.shared_expert_intermediate_size");
  r.set("model.norm_topk_prob", true, "architectures (Qwen3.5-MoE renormalises the top-k)");
  r.set("model.moe_layer_freq", int64_t(1), "architectures (Qwen3.5-MoE: every layer sparse)");
  if (!c.contains("intermediate_size"))  // (no dense layer: the dense MLP width is never used)
    if (auto f = get_int(c, "moe_intermediate_size"))
      r.set("model.intermediate_size", *f, "moe_intermediate_size (Qwen3.5-MoE has no dense layer)");
}

bool fits_hybrid(const ModelConfig& cfg) {
  return cfg.is_hybrid() && cfg.qk_norm && cfg.attn_output_gate && cfg.zero_centered_norm && !cfg.is_mla() &&
         !cfg.linear_fused_projections && cfg.moe_n_group == 1 && cfg.moe_routed_scaling_factor == 1.0 &&
         cfg.moe_router == "softmax" && !cfg.moe_router_bias && cfg.n_shared_experts == 0 &&
         cfg.first_k_dense_replace == 0 && cfg.mtp_num_layers <= 1;
}


void write_hybrid(const ModelConfig& cfg, nlohmann::json& j) {
  write_mtp(cfg, j);
  j["attention_bias"] = cfg.qkv_bias;
  j["full_attention_interval"] = cfg.full_attention_interval;
  nlohmann::json types = nlohmann::json::array();
  for (int64_t l = 0; l < cfg.n_layers; ++l) types.push_back(cfg.is_linear_layer(l) ? "linear_attention" : "full_attention");
  j["layer_types"] = types;
  j["linear_num_key_heads"] = cfg.linear_num_key_heads;
  j["linear_num_value_heads"] = cfg.linear_num_value_heads;
  j["linear_key_head_dim"] = cfg.linear_key_head_dim;
  j["linear_value_head_dim"] = cfg.linear_value_head_dim;
  j["linear_conv_kernel_dim"] = cfg.linear_conv_kernel_dim;
  j["partial_rotary_factor"] = cfg.partial_rotary_factor;
}

void write_hybrid_moe(const ModelConfig& cfg, nlohmann::json& j) {
  write_hybrid(cfg, j);
  j["num_experts"] = cfg.n_experts;
  j["num_experts_per_tok"] = cfg.n_experts_per_tok;
  j["moe_intermediate_size"] = cfg.moe_intermediate_size;
  j["shared_expert_intermediate_size"] = cfg.shared_expert_intermediate_size;
}

// The multimodal checkpoints' names: the text model under model.language_model.
std::string language_model_name(const std::string& name) {
  if (name.rfind("model.", 0) == 0) return "model.language_model." + name.substr(6);
  return name;
}

// (MTP layers a model without a depth does not take are skipped for every family: io/tensor_io.cpp)
bool outside_text_model(const std::string& file_name) { return file_name.rfind("model.visual.", 0) == 0; }

Architecture hybrid_family(const char* model_type, const char* hf_class, bool moe, bool multimodal) {
  Architecture a;
  a.model_type = model_type;
  a.hf_class = hf_class;
  a.moe = moe;
  a.hybrid = true;
  a.nested_text_config = multimodal;
  a.no_dense_layers = moe;
  a.read_config = moe ? +[](const nlohmann::json& c, HfConfigReader& r) {
    read_hybrid(c, r);
    read_hybrid_moe(c, r);
  } : +[](const nlohmann::json& c, HfConfigReader& r) {
    read_hybrid(c, r);
    refuse_experts(c, r);
  };
  // (a model exports as the text class; the multimodal one is read only)
  a.fits = multimodal ? +[](const ModelConfig&) { return false; }
           : moe      ? +[](const ModelConfig& cfg) {
                          return fits_hybrid(cfg) && cfg.shared_expert_intermediate_size > 0 && cfg.norm_topk_prob &&
                                 cfg.moe_layer_freq == 1;
                        }
                      : +[](const ModelConfig& cfg) { return fits_hybrid(cfg); };
  a.write_config = moe ? write_hybrid_moe : write_hybrid;
  if (multimodal) {
    a.tensor_name = language_model_name;
    a.file_marker = "model.language_model.";
  }
  a.not_loaded = outside_text_model;
  a.mtp_layout = Architecture::MtpLayout::Qwen;
  a.file_shape = [](const std::string& name, const std::vector<int64_t>& shape) {
    const std::string conv = "linear_attn.conv1d.weight";
    const bool is_conv = name.size() >= conv.size() && name.compare(name.size() - conv.size(), conv.size(), conv) == 0;
    return is_conv && shape.size() == 2 ? std::vector<int64_t>{shape[0], 1, shape[1]} : shape;
  };
  return a;
}

// Qwen3-Next's files use slimpi's names (in_proj_qkvz, in_proj_ba are the parameters'
// own); the naming is the family's only so that its MTP layers are skipped.
std::string same_name(const std::string& name) { return name; }

}  // namespace

Architecture qwen3_next_architecture() {
  Architecture a = hybrid_family("qwen3_next", "Qwen3NextForCausalLM", true, false);
  a.no_dense_layers = false;  // (decoder_sparse_step > 1 leaves dense layers)
  a.read_config = [](const nlohmann::json& c, HfConfigReader& r) {
    read_hybrid(c, r);
    r.set("model.linear_fused_projections", true, "architectures (Qwen3-Next: in_proj_qkvz, in_proj_ba)");
    read_qwen_moe(c, r);
    r.required(c, "shared_expert_intermediate_size", "model.shared_expert_intermediate_size");
  };
  a.fits = [](const ModelConfig& cfg) {
    return cfg.is_hybrid() && cfg.qk_norm && cfg.attn_output_gate && cfg.zero_centered_norm &&
           cfg.linear_fused_projections && cfg.moe_router == "softmax" && !cfg.moe_router_bias &&
           cfg.moe_n_group == 1 && cfg.moe_routed_scaling_factor == 1.0 &&
           cfg.n_shared_experts == 0 && cfg.first_k_dense_replace == 0 && cfg.mtp_num_layers <= 1 &&
           cfg.shared_expert_intermediate_size > 0;
  };
  a.write_config = [](const ModelConfig& cfg, nlohmann::json& j) {
    write_hybrid(cfg, j);
    write_qwen_moe(cfg, j);
    j["shared_expert_intermediate_size"] = cfg.shared_expert_intermediate_size;
  };
  a.tensor_name = same_name;
  a.file_marker = ".linear_attn.in_proj_qkvz.";
  a.mtp_layout = Architecture::MtpLayout::Qwen;
  return a;
}

Architecture qwen3_5_architecture() {
  return hybrid_family("qwen3_5", "Qwen3_5ForConditionalGeneration", false, true);
}
Architecture qwen3_5_text_architecture() { return hybrid_family("qwen3_5_text", "Qwen3_5ForCausalLM", false, false); }
Architecture qwen3_5_moe_architecture() {
  return hybrid_family("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", true, true);
}
Architecture qwen3_5_moe_text_architecture() {
  return hybrid_family("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", true, false);
}

}  // namespace slimpi
