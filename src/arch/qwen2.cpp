// Qwen2ForCausalLM: q/k/v biases always, no o bias, no q/k norms, dense.
#include <nlohmann/json.hpp>

#include "arch/architecture.h"
#include "arch/hf_config_reader.h"
#include "model/model_config.h"

namespace slimpi {

Architecture qwen2_architecture() {
  Architecture a;
  a.model_type = "qwen2";
  a.hf_class = "Qwen2ForCausalLM";
  a.moe = false;
  a.read_config = [](const nlohmann::json& c, HfConfigReader& r) {
    r.set("model.qkv_bias", true, "architectures (Qwen2: q/k/v biases)");
    r.set("model.o_bias", false, "architectures (Qwen2: no o bias)");
    r.set("model.qk_norm", false, "architectures (no q/k norms)");
    refuse_experts(c, r);
  };
  // With MTP depths the model is MiMo's (arch/mimo.cpp).
  a.fits = [](const ModelConfig& cfg) { return !cfg.qk_norm && cfg.qkv_bias && !cfg.o_bias && cfg.mtp_num_layers == 0; };
  a.write_config = [](const ModelConfig&, nlohmann::json&) {};
  return a;
}

}  // namespace slimpi
