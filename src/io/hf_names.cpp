#include "io/hf_names.h"

namespace slimpi {

std::string mixtral_name(const std::string& name) {
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

bool is_hf_expert_name(const std::string& name) {
  return name.find(".mlp.experts.") != std::string::npos || name.find(".block_sparse_moe.experts.") != std::string::npos;
}

}  // namespace slimpi
