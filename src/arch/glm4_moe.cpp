// Glm4MoeForCausalLM (GLM-4.5, GLM-4.6, GLM-4.7): grouped-query attention with q/k/v
// biases (attention_bias; no o bias), optional q/k norms (use_qk_norm), RoPE over the
// first partial_rotary_factor of each head (0.5 when config.json leaves it out, as
// transformers' Glm4MoeConfig does), and DeepSeekMoE layers (model/moe.h): sigmoid
// router with e_score_correction_bias, group-limited top-k (n_group, topk_group),
// routed_scaling_factor, n_shared_experts ungated shared experts, the first
// first_k_dense_replace layers dense. Its files use slimpi's names
// (mlp.gate.weight, mlp.gate.e_score_correction_bias, mlp.experts.<e>.*,
// mlp.shared_experts.*).
#include <nlohmann/json.hpp>

#include <tuple>

#include "arch/architecture.h"
#include "arch/hf_config_reader.h"
#include "model/model_config.h"

namespace slimpi {

void read_deepseek_moe(const nlohmann::json& c, HfConfigReader& r, const DeepSeekMoeDefaults& absent) {
  r.required(c, "n_routed_experts", "model.n_experts");
  r.required(c, "num_experts_per_tok", "model.n_experts_per_tok");
  r.required(c, "moe_intermediate_size", "model.moe_intermediate_size");
  r.set("model.moe_router", std::string("sigmoid"), "architectures (DeepSeekMoE: sigmoid router)");
  r.set("model.moe_router_bias", true, "architectures (DeepSeekMoE: e_score_correction_bias)");
  r.set("model.norm_topk_prob", get_bool(c, "norm_topk_prob").value_or(true), "norm_topk_prob");
  r.set("model.moe_routed_scaling_factor", get_float(c, "routed_scaling_factor").value_or(absent.routed_scaling_factor),
        "routed_scaling_factor");
  for (const auto& [field, key, def] : {std::tuple{"n_group", "model.moe_n_group", absent.n_group},
                                        {"topk_group", "model.moe_topk_group", absent.topk_group}})
    if (auto n = get_int(c, field); n && *n <= 0) r.fail("'{}' = {} must be positive", field, *n);
    else r.set(key, n.value_or(def), field);
  if (auto n = get_int(c, "n_shared_experts"); n && *n < 0) r.fail("'n_shared_experts' = {} must not be negative", *n);
  else r.set("model.n_shared_experts", n.value_or(1), "n_shared_experts");
  if (auto n = get_int(c, "first_k_dense_replace"); n && *n < 0)
    r.fail("'first_k_dense_replace' = {} must not be negative", *n);
  else r.set("model.first_k_dense_replace", n.value_or(absent.first_k_dense_replace), "first_k_dense_replace");
  r.set("model.moe_layer_freq", int64_t(1), "architectures (DeepSeekMoE: every layer past the dense ones sparse)");
  r.set("model.shared_expert_intermediate_size", int64_t(0), "architectures (DeepSeekMoE: ungated shared experts)");
  const std::string scoring = c.value("scoring_func", std::string("sigmoid"));
  if (scoring != "sigmoid") r.fail("scoring_func '{}' is not supported (sigmoid)", scoring);
  const std::string topk_method = c.value("topk_method", std::string("noaux_tc"));
  if (topk_method != "noaux_tc") r.fail("topk_method '{}' is not supported (noaux_tc)", topk_method);
}

void write_deepseek_moe(const ModelConfig& cfg, nlohmann::json& j) {
  j["n_routed_experts"] = cfg.n_experts;
  j["num_local_experts"] = cfg.n_experts;  // transformers 5's name
  j["num_experts_per_tok"] = cfg.n_experts_per_tok;
  j["moe_intermediate_size"] = cfg.moe_intermediate_size;
  j["norm_topk_prob"] = cfg.norm_topk_prob;
  j["routed_scaling_factor"] = cfg.moe_routed_scaling_factor;
  j["n_group"] = cfg.moe_n_group;
  j["topk_group"] = cfg.moe_topk_group;
  j["n_shared_experts"] = cfg.n_shared_experts;
  j["first_k_dense_replace"] = cfg.first_k_dense_replace;
  j["scoring_func"] = "sigmoid";
  j["topk_method"] = "noaux_tc";
}

bool is_deepseek_moe(const ModelConfig& cfg) {
  return cfg.n_experts > 0 && cfg.moe_router == "sigmoid" && cfg.moe_router_bias && cfg.moe_layer_freq == 1 &&
         cfg.shared_expert_intermediate_size == 0;
}

Architecture glm4_moe_architecture() {
  Architecture a;
  a.model_type = "glm4_moe";
  a.hf_class = "Glm4MoeForCausalLM";
  a.moe = true;
  a.deepseek_moe = true;
  a.read_config = [](const nlohmann::json& c, HfConfigReader& r) {
    r.set("model.qkv_bias", get_bool(c, "attention_bias").value_or(false), "attention_bias");
    r.set("model.o_bias", false, "architectures (GLM-4.5: no o bias)");
    r.set("model.qk_norm", get_bool(c, "use_qk_norm").value_or(false), "use_qk_norm");
    read_partial_rotary_factor(c, r, 0.5);
    read_deepseek_moe(c, r, {1.0, 1, 1, 1});  // Glm4MoeConfig's defaults
  };
  a.fits = [](const ModelConfig& cfg) { return is_deepseek_moe(cfg) && !cfg.o_bias && !cfg.is_mla(); };
  a.write_config = [](const ModelConfig& cfg, nlohmann::json& j) {
    write_deepseek_moe(cfg, j);
    j["attention_bias"] = cfg.qkv_bias;
    j["use_qk_norm"] = cfg.qk_norm;
    j["partial_rotary_factor"] = cfg.partial_rotary_factor;
  };
  return a;
}

}  // namespace slimpi
