// Qwen2MoeForCausalLM: Qwen2's attention (q/k/v biases per qkv_bias, no o bias, no q/k
// norms) with sparse MLP layers and a gated shared expert.
#include <nlohmann/json.hpp>

#include "arch/architecture.h"
#include "arch/hf_config_reader.h"
#include "model/model_config.h"

namespace slimpi {

Architecture qwen2_moe_architecture() {
  Architecture a;
  a.model_type = "qwen2_moe";
  a.hf_class = "Qwen2MoeForCausalLM";
  a.moe = true;
  a.read_config = [](const nlohmann::json& c, HfConfigReader& r) {
    r.set("model.qkv_bias", get_bool(c, "qkv_bias").value_or(true), "qkv_bias");
    r.set("model.o_bias", false, "architectures (Qwen2-MoE: no o bias)");
    r.set("model.qk_norm", false, "architectures (no q/k norms)");
    read_qwen_moe(c, r);
    r.required(c, "shared_expert_intermediate_size", "model.shared_expert_intermediate_size");
  };
  a.fits = [](const ModelConfig& cfg) {
    return cfg.shared_expert_intermediate_size > 0 && !cfg.qk_norm && !cfg.o_bias;
  };
  a.write_config = [](const ModelConfig& cfg, nlohmann::json& j) {
    write_qwen_moe(cfg, j);
    j["shared_expert_intermediate_size"] = cfg.shared_expert_intermediate_size;
    j["qkv_bias"] = cfg.qkv_bias;
  };
  return a;
}

}  // namespace slimpi
