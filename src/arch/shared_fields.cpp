// Config fields several families share (arch/architecture.h).
#include <nlohmann/json.hpp>

#include "arch/architecture.h"
#include "arch/hf_config_reader.h"
#include "model/model_config.h"

namespace slimpi {

void read_attention_bias(const nlohmann::json& c, HfConfigReader& r) {
  const bool bias = get_bool(c, "attention_bias").value_or(false);
  r.set("model.qkv_bias", bias, "attention_bias");
  r.set("model.o_bias", bias, "attention_bias");
}

void refuse_experts(const nlohmann::json& c, HfConfigReader& r) {
  for (const char* moe : {"num_experts", "num_local_experts", "n_routed_experts"})
    if (get_int(c, moe).value_or(0) > 0)
      r.fail("'{}' > 0: of the mixture-of-experts architectures only {} are supported", moe,
             architecture_classes(/*moe_only=*/true));
}

void read_qwen_moe(const nlohmann::json& c, HfConfigReader& r) {
  // transformers 5 names the expert count num_local_experts, 4 num_experts.
  const char* experts = c.contains("num_local_experts") ? "num_local_experts" : "num_experts";
  r.required(c, experts, "model.n_experts");
  r.required(c, "num_experts_per_tok", "model.n_experts_per_tok");
  r.required(c, "moe_intermediate_size", "model.moe_intermediate_size");
  r.set("model.norm_topk_prob", get_bool(c, "norm_topk_prob").value_or(false), "norm_topk_prob");
  if (auto step = get_int(c, "decoder_sparse_step"); step && *step <= 0)
    r.fail("'decoder_sparse_step' = {} must be positive", *step);
  else r.set("model.moe_layer_freq", step.value_or(1), "decoder_sparse_step");
  if (auto it = c.find("mlp_only_layers"); it != c.end() && it->is_array() && !it->empty())
    r.fail("mlp_only_layers = {} is not supported (every (l + 1) % decoder_sparse_step == 0 layer is sparse)",
           it->dump());
}

void write_qwen_moe(const ModelConfig& cfg, nlohmann::json& j) {
  // Both names of the expert count: transformers 4 reads num_experts, 5 num_local_experts.
  j["num_experts"] = cfg.n_experts;
  j["num_local_experts"] = cfg.n_experts;
  j["num_experts_per_tok"] = cfg.n_experts_per_tok;
  j["moe_intermediate_size"] = cfg.moe_intermediate_size;
  j["norm_topk_prob"] = cfg.norm_topk_prob;
  j["decoder_sparse_step"] = cfg.moe_layer_freq;
  j["mlp_only_layers"] = nlohmann::json::array();
}

std::optional<std::pair<double, const char*>> find_partial_rotary_factor(const nlohmann::json& c) {
  if (auto it = c.find("rope_parameters"); it != c.end() && it->is_object())
    if (auto f = get_float(*it, "partial_rotary_factor")) return std::pair{*f, "rope_parameters.partial_rotary_factor"};
  if (auto f = get_float(c, "partial_rotary_factor")) return std::pair{*f, "partial_rotary_factor"};
  return std::nullopt;
}

void read_partial_rotary_factor(const nlohmann::json& c, HfConfigReader& r, double absent) {
  const auto f = find_partial_rotary_factor(c);
  if (f && !(f->first > 0 && f->first <= 1)) r.fail("'{}' = {} must be in (0, 1]", f->second, f->first);
  else r.set("model.partial_rotary_factor", f ? f->first : absent, f ? f->second : "architectures (its default)");
}

}  // namespace slimpi
