// DeepseekV3ForCausalLM (DeepSeek-V3, R1, Kimi-K2's architecture) and
// Glm4MoeLiteForCausalLM (GLM-4.7-Flash): multi-head latent attention
// (model/transformer_mla.cpp; q_lora_rank null = q_proj, rope_interleave) and DeepSeekMoE
// layers (arch/glm4_moe.cpp's fields; GLM-4.7-Flash names its dense layers by
// mlp_layer_types, DeepSeek-V3 by first_k_dense_replace). Their files use slimpi's names
// (self_attn.q_a_proj, q_a_layernorm, q_b_proj or q_proj, kv_a_proj_with_mqa,
// kv_a_layernorm, kv_b_proj, o_proj).
#include <nlohmann/json.hpp>

#include "arch/architecture.h"
#include "arch/hf_config_reader.h"
#include "model/model_config.h"

namespace slimpi {
namespace {

void read_mla(const nlohmann::json& c, HfConfigReader& r) {
  r.required(c, "kv_lora_rank", "model.kv_lora_rank");
  r.required(c, "qk_nope_head_dim", "model.qk_nope_head_dim");
  r.required(c, "qk_rope_head_dim", "model.qk_rope_head_dim");
  r.required(c, "v_head_dim", "model.v_head_dim");
  if (auto q = get_int(c, "q_lora_rank"); q && *q <= 0) r.fail("'q_lora_rank' = {} must be positive or null", *q);
  else r.set("model.q_lora_rank", q.value_or(0), "q_lora_rank");
  r.set("model.rope_interleave", get_bool(c, "rope_interleave").value_or(true), "rope_interleave");
  r.set("model.head_dim", int64_t(0), "architectures (MLA: qk_nope_head_dim + qk_rope_head_dim)");
  r.set("model.qkv_bias", false, "architectures (MLA)");
  r.set("model.o_bias", false, "architectures (MLA)");
  r.set("model.qk_norm", false, "architectures (MLA)");
  if (get_bool(c, "attention_bias").value_or(false)) r.fail("attention_bias = true is not supported with MLA");
}

// GLM-4.7-Flash's mlp_layer_types: some dense layers, then sparse ones.
void read_mlp_layer_types(const nlohmann::json& c, HfConfigReader& r) {
  auto it = c.find("mlp_layer_types");
  if (it == c.end() || it->is_null()) return;
  int64_t dense = 0;
  bool sparse_seen = false, ok = it->is_array();
  for (const auto& t : ok ? *it : nlohmann::json::array()) {
    if (t == "dense" && !sparse_seen) ++dense;
    else if (t == "sparse") sparse_seen = true;
    else ok = false;
  }
  if (!ok) r.fail("mlp_layer_types = {} is not supported (some \"dense\" layers, then \"sparse\" ones)", it->dump());
  else r.set("model.first_k_dense_replace", dense, "mlp_layer_types");
}

Architecture mla_family(const char* model_type, const char* hf_class,
                        void (*read_config)(const nlohmann::json& c, HfConfigReader& r)) {
  Architecture a;
  a.model_type = model_type;
  a.hf_class = hf_class;
  a.moe = true;
  a.deepseek_moe = true;
  a.read_config = read_config;
  a.write_config = [](const ModelConfig& cfg, nlohmann::json& j) {
    write_deepseek_moe(cfg, j);
    j["kv_lora_rank"] = cfg.kv_lora_rank;
    j["q_lora_rank"] = cfg.q_lora_rank > 0 ? nlohmann::json(cfg.q_lora_rank) : nlohmann::json(nullptr);
    j["qk_nope_head_dim"] = cfg.qk_nope_head_dim;
    j["qk_rope_head_dim"] = cfg.qk_rope_head_dim;
    j["v_head_dim"] = cfg.v_head_dim;
    j["rope_interleave"] = cfg.rope_interleave;
    j["head_dim"] = cfg.qk_rope_head_dim;  // as transformers' DeepseekV3Config sets it
    j["attention_bias"] = false;
  };
  return a;
}

}  // namespace

Architecture deepseek_v3_architecture() {
  Architecture a = mla_family("deepseek_v3", "DeepseekV3ForCausalLM",
                              [](const nlohmann::json& c, HfConfigReader& r) {
    read_mla(c, r);
    read_deepseek_moe(c, r, {2.5, 8, 4, 3});  // DeepseekV3Config's defaults
  });
  a.fits = [](const ModelConfig& cfg) { return cfg.is_mla() && is_deepseek_moe(cfg); };
  return a;
}

Architecture glm4_moe_lite_architecture() {
  Architecture a = mla_family("glm4_moe_lite", "Glm4MoeLiteForCausalLM",
                              [](const nlohmann::json& c, HfConfigReader& r) {
    read_mla(c, r);
    read_deepseek_moe(c, r, {1.8, 1, 1, 1});  // Glm4MoeLiteConfig's defaults (mlp_layer_types: one dense layer)
    read_mlp_layer_types(c, r);
  });
  a.fits = [](const ModelConfig&) { return false; };  // exported as deepseek_v3 (the same model)
  return a;
}

}  // namespace slimpi
