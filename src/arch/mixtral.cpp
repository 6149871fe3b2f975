// MixtralForCausalLM: every layer sparse, intermediate_size is each expert's width, the
// top-k probabilities always renormalised, no shared expert, no attention biases, no
// q/k norms. Its files name the MoE tensors its own way:
//   model.layers.<l>.mlp.gate.weight                  <-> model.layers.<l>.block_sparse_moe.gate.weight
//   model.layers.<l>.mlp.experts.<e>.gate_proj.weight <-> ...block_sparse_moe.experts.<e>.w1.weight
//   ...mlp.experts.<e>.up_proj.weight                 <-> ...block_sparse_moe.experts.<e>.w3.weight
//   ...mlp.experts.<e>.down_proj.weight               <-> ...block_sparse_moe.experts.<e>.w2.weight
#include <nlohmann/json.hpp>

#include <utility>

#include "arch/architecture.h"
#include "arch/hf_config_reader.h"
#include "model/model_config.h"

namespace slimpi {
namespace {

std::string mixtral_tensor_name(const std::string& name) {
  const std::string mlp = ".mlp.";
  const size_t at = name.find(mlp);
  if (at == std::string::npos) return name;
  const std::string head = name.substr(0, at) + ".block_sparse_moe.", tail = name.substr(at + mlp.size());
  if (tail == "gate.weight") return head + tail;
  if (tail.rfind("experts.", 0) != 0) return name;  // the dense MLP and shared experts keep their names
  for (const auto& [ours, theirs] : {std::pair<std::string, std::string>{"gate_proj.", "w1."},
                                     {"up_proj.", "w3."}, {"down_proj.", "w2."}}) {
    const size_t p = tail.find(ours);
    if (p != std::string::npos) return head + tail.substr(0, p) + theirs + tail.substr(p + ours.size());
  }
  return name;
}

}  // namespace

Architecture mixtral_architecture() {
  Architecture a;
  a.model_type = "mixtral";
  a.hf_class = "MixtralForCausalLM";
  a.moe = true;
  a.read_config = [](const nlohmann::json& c, HfConfigReader& r) {
    read_attention_bias(c, r);
    r.set("model.qk_norm", false, "architectures (no q/k norms)");
    r.required(c, "num_local_experts", "model.n_experts");
    r.required(c, "num_experts_per_tok", "model.n_experts_per_tok");
    r.required(c, "intermediate_size", "model.moe_intermediate_size");
    r.set("model.norm_topk_prob", true, "architectures (Mixtral: top-k probabilities renormalised)");
    r.set("model.moe_layer_freq", int64_t(1), "architectures (Mixtral: every layer sparse)");
    r.set("model.shared_expert_intermediate_size", int64_t(0), "architectures (Mixtral: no shared expert)");
    if (auto w = get_int(c, "sliding_window"); w && *w < get_int(c, "max_position_embeddings").value_or(0))
      r.fail("sliding_window = {} is not supported (attention over the whole context; null or >= "
             "max_position_embeddings has no effect)", *w);
    if (get_float(c, "router_jitter_noise").value_or(0.0) != 0.0)
      r.fail("router_jitter_noise != 0 is not supported (the router's logits are used as they are)");
  };
  a.fits = [](const ModelConfig& cfg) {
    return cfg.shared_expert_intermediate_size == 0 && !cfg.qk_norm && !cfg.qkv_bias && !cfg.o_bias &&
           cfg.moe_layer_freq == 1 && cfg.norm_topk_prob;
  };
  a.write_config = [](const ModelConfig& cfg, nlohmann::json& j) {
    j["intermediate_size"] = cfg.moe_intermediate_size;  // each expert's width
    j["num_local_experts"] = cfg.n_experts;
    j["num_experts_per_tok"] = cfg.n_experts_per_tok;
    j["sliding_window"] = nullptr;
    j["router_jitter_noise"] = 0.0;
  };
  a.tensor_name = mixtral_tensor_name;
  a.file_marker = ".block_sparse_moe.";
  a.expert_marker = ".block_sparse_moe.experts.";
  return a;
}

}  // namespace slimpi
