#include "arch/architecture.h"

#include <fmt/ranges.h>

#include "model/model_config.h"

namespace slimpi {

const Registry<Architecture>& architectures() {
  static const Registry<Architecture> r = [] {
    Registry<Architecture> reg("Hugging Face model_type");
    for (const Architecture& a : {llama_architecture(), qwen2_architecture(), qwen3_architecture(),
                                  qwen2_moe_architecture(), qwen3_moe_architecture(), mixtral_architecture(),
                                  mimo_architecture(), glm4_moe_architecture(), deepseek_v3_architecture(),
                                  glm4_moe_lite_architecture(), qwen3_5_architecture(), qwen3_5_text_architecture(),
                                  qwen3_5_moe_architecture(), qwen3_5_moe_text_architecture(), qwen3_next_architecture()})
      reg.add(a.model_type, a);
    return reg;
  }();
  return r;
}

namespace {

std::vector<const Architecture*> all_architectures() {
  std::vector<const Architecture*> out;
  for (const std::string& name : architectures().names()) out.push_back(&architectures().get(name));
  return out;
}

}  // namespace

const Architecture* architecture_of_config(const std::string& hf_class, const std::string& model_type) {
  for (const Architecture* a : all_architectures())
    if (hf_class.empty() ? model_type == a->model_type : hf_class == a->hf_class) return a;
  return nullptr;
}

const Architecture* export_architecture(const ModelConfig& cfg) {
  for (const Architecture* a : all_architectures()) {
    if (a->moe != (cfg.n_experts > 0) || a->hybrid != cfg.is_hybrid()) continue;
    // (a hybrid family's partial RoPE is its own, not DeepSeek's)
    if (!a->hybrid && a->deepseek_moe != cfg.uses_deepseek_features()) continue;
    if (a->fits(cfg)) return a;
  }
  return nullptr;
}

const Architecture* architecture_naming(const std::vector<std::string>& file_tensor_names) {
  for (const Architecture* a : all_architectures())
    if (a->file_marker)
      for (const std::string& name : file_tensor_names)
        if (name.find(a->file_marker) != std::string::npos) return a;
  return nullptr;
}

bool is_hf_expert_name(const std::string& name) {
  for (const Architecture* a : all_architectures())
    if (name.find(a->expert_marker) != std::string::npos) return true;
  return false;
}

std::string architecture_classes(bool moe_only) {
  // Dense families first, then the mixture-of-experts ones (each group by model_type).
  std::vector<std::string> dense, moe;
  for (const Architecture* a : all_architectures()) (a->moe ? moe : dense).push_back(a->hf_class);
  std::vector<std::string> all = moe_only ? moe : dense;
  if (!moe_only) all.insert(all.end(), moe.begin(), moe.end());
  return fmt::format("{}", fmt::join(all, ", "));
}

}  // namespace slimpi
