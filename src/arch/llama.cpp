// LlamaForCausalLM: q/k/v and o biases alike (attention_bias), no q/k norms, dense.
// Exported for every dense model without q/k norms that is not Qwen2's bias pattern.
#include <nlohmann/json.hpp>

#include "arch/architecture.h"
#include "arch/hf_config_reader.h"
#include "model/model_config.h"

namespace slimpi {

Architecture llama_architecture() {
  Architecture a;
  a.model_type = "llama";
  a.hf_class = "LlamaForCausalLM";
  a.moe = false;
  a.read_config = [](const nlohmann::json& c, HfConfigReader& r) {
    read_attention_bias(c, r);
    r.set("model.qk_norm", false, "architectures (no q/k norms)");
    refuse_experts(c, r);
  };
  a.fits = [](const ModelConfig& cfg) { return !cfg.qk_norm && !(cfg.qkv_bias && !cfg.o_bias); };
  a.write_config = [](const ModelConfig& cfg, nlohmann::json& j) {
    j["attention_bias"] = cfg.qkv_bias;
    j["mlp_bias"] = false;
  };
  return a;
}

}  // namespace slimpi
