// Qwen3MoeForCausalLM: Qwen3's attention (q/k norms) with sparse MLP layers (every
// decoder_sparse_step-th), no shared expert.
#include <nlohmann/json.hpp>

#include "arch/architecture.h"
#include "arch/hf_config_reader.h"
#include "model/model_config.h"

namespace slimpi {

void read_qwen3_attention(const nlohmann::json& c, HfConfigReader& r);  // arch/qwen3.cpp

Architecture qwen3_moe_architecture() {
  Architecture a;
  a.model_type = "qwen3_moe";
  a.hf_class = "Qwen3MoeForCausalLM";
  a.moe = true;
  a.read_config = [](const nlohmann::json& c, HfConfigReader& r) {
    read_qwen3_attention(c, r);
    read_qwen_moe(c, r);
    r.set("model.shared_expert_intermediate_size", int64_t(0), "architectures (Qwen3-MoE: no shared expert)");
  };
  a.fits = [](const ModelConfig& cfg) { return cfg.qk_norm && cfg.shared_expert_intermediate_size == 0; };
  a.write_config = [](const ModelConfig& cfg, nlohmann::json& j) {
    write_qwen_moe(cfg, j);
    j["attention_bias"] = cfg.qkv_bias;
  };
  return a;
}

}  // namespace slimpi
