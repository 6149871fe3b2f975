#include "arch/mtp_names.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include <array>
#include <utility>

namespace slimpi {
namespace {

const std::string kMtpPrefix = "model.mtp_layers.";

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// slimpi's tail -> DeepSeek's, for the tensors they name differently.
const std::array<std::pair<const char*, const char*>, 4> kRenamed{{{"token_layernorm.weight", "enorm.weight"},
                                                                  {"hidden_layernorm.weight", "hnorm.weight"},
                                                                  {"input_proj.weight", "eh_proj.weight"},
                                                                  {"final_layernorm.weight", "shared_head.norm.weight"}}};

// slimpi's tail -> Qwen3.5's (after "mtp."), for the tensors outside the depth's layer.
const std::array<std::pair<const char*, const char*>, 4> kQwenRenamed{
    {{"token_layernorm.weight", "pre_fc_norm_embedding.weight"},
     {"hidden_layernorm.weight", "pre_fc_norm_hidden.weight"},
     {"input_proj.weight", "fc.weight"},
     {"final_layernorm.weight", "norm.weight"}}};

}  // namespace

bool is_mtp_parameter(const std::string& name) { return name.rfind(kMtpPrefix, 0) == 0; }

bool is_mtp_input_proj(const std::string& name) { return is_mtp_parameter(name) && ends_with(name, ".input_proj.weight"); }

std::string deepseek_mtp_name(const std::string& name, int64_t n_layers) {
  SLIMPI_CHECK(is_mtp_parameter(name), "{} is not an MTP depth's tensor", name);
  const size_t dot = name.find('.', kMtpPrefix.size());
  const int64_t depth = std::stoll(name.substr(kMtpPrefix.size(), dot - kMtpPrefix.size()));
  std::string tail = name.substr(dot + 1);
  for (const auto& [ours, theirs] : kRenamed)
    if (tail == ours) tail = theirs;
  return "model.layers." + std::to_string(n_layers + depth) + "." + tail;
}

std::string qwen_mtp_name(const std::string& name) {
  SLIMPI_CHECK(is_mtp_parameter(name), "{} is not an MTP depth's tensor", name);
  const size_t dot = name.find('.', kMtpPrefix.size());
  const std::string depth = name.substr(kMtpPrefix.size(), dot - kMtpPrefix.size()), tail = name.substr(dot + 1);
  SLIMPI_CHECK(depth == "0", "{}: Qwen3.5's files hold one MTP depth (mtp.*; model.mtp_num_layers = 1)", name);
  for (const auto& [ours, theirs] : kQwenRenamed)
    if (tail == ours) return std::string("mtp.") + theirs;
  return "mtp.layers.0." + tail;
}

bool uses_qwen_mtp_names(const std::vector<std::string>& file_tensor_names) {
  for (const auto& n : file_tensor_names)
    if (n == "mtp.fc.weight") return true;
  return false;
}

bool uses_deepseek_mtp_names(const std::vector<std::string>& file_tensor_names) {
  for (const auto& n : file_tensor_names)
    if (ends_with(n, ".eh_proj.weight")) return true;
  return false;
}

bool is_deepseek_mtp_copy(const std::string& file_name) {
  return file_name.rfind("model.layers.", 0) == 0 &&
         (ends_with(file_name, ".shared_head.head.weight") || ends_with(file_name, ".embed_tokens.weight"));
}

at::Tensor swap_input_proj_halves(const at::Tensor& w) {
  SLIMPI_CHECK(w.dim() == 2 && w.size(1) == 2 * w.size(0), "an MTP input projection of shape [{}, {}]: [d, 2d] expected",
               w.size(0), w.dim() == 2 ? w.size(1) : 0);
  const int64_t d = w.size(0);
  return at::cat({w.narrow(1, d, d), w.narrow(1, 0, d)}, 1);
}

}  // namespace slimpi
