// Qwen3ForCausalLM: q/k norms (each head RMS-normalised before RoPE), q/k/v and o biases
// alike (attention_bias), head_dim 128 when config.json leaves it out, dense.
#include <nlohmann/json.hpp>

#include "arch/architecture.h"
#include "arch/hf_config_reader.h"
#include "model/model_config.h"

namespace slimpi {

// Qwen3's and Qwen3-MoE's attention fields.
void read_qwen3_attention(const nlohmann::json& c, HfConfigReader& r) {
  if (!get_int(c, "head_dim")) r.set("model.head_dim", int64_t(128), "head_dim (Qwen3's default)");
  read_attention_bias(c, r);
  r.set("model.qk_norm", true, "architectures (Qwen3: q_norm/k_norm)");
}

Architecture qwen3_architecture() {
  Architecture a;
  a.model_type = "qwen3";
  a.hf_class = "Qwen3ForCausalLM";
  a.moe = false;
  a.read_config = [](const nlohmann::json& c, HfConfigReader& r) {
    read_qwen3_attention(c, r);
    refuse_experts(c, r);
  };
  a.fits = [](const ModelConfig& cfg) { return cfg.qk_norm; };
  a.write_config = [](const ModelConfig& cfg, nlohmann::json& j) { j["attention_bias"] = cfg.qkv_bias; };
  return a;
}

}  // namespace slimpi
