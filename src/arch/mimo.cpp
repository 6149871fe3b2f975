// MiMoForCausalLM (Xiaomi's MiMo): Qwen2's layers and config fields (q/k/v biases, no o
// bias, no q/k norms, dense) plus num_nextn_predict_layers multi-token-prediction depths
// under "model.mtp_layers.<i>." — slimpi's own names for them (model/transformer.h), the
// input projection's columns hidden first as MiMo has them.
#include "arch/architecture.h"
#include "model/model_config.h"

namespace slimpi {

Architecture mimo_architecture() {
  Architecture a = qwen2_architecture();  // its config fields and tensor names
  a.model_type = "mimo";
  a.hf_class = "MiMoForCausalLM";
  a.fits = [](const ModelConfig& cfg) { return !cfg.qk_norm && cfg.qkv_bias && !cfg.o_bias && cfg.mtp_num_layers > 0; };
  a.mtp_layout = Architecture::MtpLayout::Slimpi;
  return a;
}

}  // namespace slimpi
