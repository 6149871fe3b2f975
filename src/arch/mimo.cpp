// MiMoForCausalLM (Xiaomi's MiMo): Qwen2's layers (q/k/v biases, no o bias, no q/k norms,
// dense) plus num_nextn_predict_layers multi-token-prediction depths under
// "model.mtp_layers.<i>." — slimpi's own names for them (model/transformer.h), the
// input projection's columns hidden first as MiMo has them.
#include <nlohmann/json.hpp>

#include "arch/architecture.h"
#include "arch/hf_config_reader.h"
#include "model/model_config.h"

namespace slimpi {

Architecture mimo_architecture() {
  Architecture a;
  a.model_type = "mimo";
  a.hf_class = "MiMoForCausalLM";
  a.moe = false;
  a.read_config = [](const nlohmann::json& c, HfConfigReader& r) {
    r.set("model.qkv_bias", true, "architectures (MiMo: Qwen2's q/k/v biases)");
    r.set("model.o_bias", false, "architectures (MiMo: no o bias)");
    r.set("model.qk_norm", false, "architectures (no q/k norms)");
    refuse_experts(c, r);
  };
  a.fits = [](const ModelConfig& cfg) { return !cfg.qk_norm && cfg.qkv_bias && !cfg.o_bias && cfg.mtp_num_layers > 0; };
  a.write_config = [](const ModelConfig&, nlohmann::json&) {};
  a.mtp_names = true;
  return a;
}

}  // namespace slimpi
