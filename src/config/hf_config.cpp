#include "config/hf_config.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "core/log.h"

namespace slimpi {
namespace {

using nlohmann::json;

std::string value_text(const DeckValue& v) {
  if (auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) return fmt::format("{}", *d);
  if (auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (auto* s = std::get_if<std::string>(&v)) return "\"" + *s + "\"";
  return "[...]";
}

bool same_value(const DeckValue& a, const DeckValue& b) {
  if (auto* x = std::get_if<double>(&a))
    if (auto* y = std::get_if<double>(&b)) return std::abs(*x - *y) <= 1e-12 * std::max(std::abs(*x), std::abs(*y));
  return a == b;
}

// The config's values as deck keys, and what is wrong with the config.
struct Resolution {
  std::string file;
  std::vector<std::tuple<std::string, DeckValue, std::string>> keys;  // deck key, value, config field
  std::vector<std::string> problems;

  void set(const std::string& key, DeckValue v, const std::string& field) {  // a later field wins
    for (auto& k : keys)
      if (std::get<0>(k) == key) {
        k = {key, std::move(v), field};
        return;
      }
    keys.emplace_back(key, std::move(v), field);
  }
  template <class... A>
  void fail(fmt::format_string<A...> f, A&&... a) {
    problems.push_back(file + ": " + fmt::format(f, std::forward<A>(a)...));
  }
};

std::optional<int64_t> get_int(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) throw std::runtime_error(fmt::format("'{}' must be an integer", field));
  return it->get<int64_t>();
}
std::optional<double> get_float(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) throw std::runtime_error(fmt::format("'{}' must be a number", field));
  return it->get<double>();
}
std::optional<bool> get_bool(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) throw std::runtime_error(fmt::format("'{}' must be true or false", field));
  return it->get<bool>();
}

void resolve_rope(const json& c, Resolution& r) {
  // transformers 5 writes rope_parameters {rope_type, rope_theta, factor, ...}; earlier
  // versions (and most Hub checkpoints) rope_theta and rope_scaling at the top level.
  const json* scaling = nullptr;
  const char* scaling_field = "rope_scaling";
  if (auto it = c.find("rope_parameters"); it != c.end() && it->is_object()) {
    scaling = &*it;
    scaling_field = "rope_parameters";
    if (auto theta = get_float(*it, "rope_theta")) r.set("model.rope_theta", *theta, "rope_parameters.rope_theta");
  }
  if (auto theta = get_float(c, "rope_theta")) r.set("model.rope_theta", *theta, "rope_theta");
  if (auto it = c.find("rope_scaling"); it != c.end() && !it->is_null()) {
    scaling = &*it;
    scaling_field = "rope_scaling";
  }
  std::string type = "default";
  if (scaling) {
    if (!scaling->is_object()) {
      r.fail("'{}' must be an object", scaling_field);
      return;
    }
    type = scaling->value("rope_type", scaling->value("type", std::string("default")));
  }
  const std::string f = scaling_field;
  if (type == "default") {
    r.set("model.rope_scaling", std::string("none"), f);
  } else if (type == "linear" || type == "llama3") {
    r.set("model.rope_scaling", type, f + ".rope_type");
    auto factor = get_float(*scaling, "factor");
    if (!factor || *factor <= 0) r.fail("{} of type {} needs a positive 'factor'", f, type);
    else r.set("model.rope_factor", *factor, f + ".factor");
    if (type == "llama3") {
      auto low = get_float(*scaling, "low_freq_factor"), high = get_float(*scaling, "high_freq_factor");
      auto original = get_int(*scaling, "original_max_position_embeddings");
      if (!low || !high || !original)
        r.fail("{} of type llama3 needs low_freq_factor, high_freq_factor and original_max_position_embeddings", f);
      else {
        r.set("model.rope_low_freq_factor", *low, f + ".low_freq_factor");
        r.set("model.rope_high_freq_factor", *high, f + ".high_freq_factor");
        r.set("model.rope_original_max_seq_len", *original, f + ".original_max_position_embeddings");
      }
    }
  } else {
    r.fail("{} type '{}' is not supported (default, linear, llama3): it changes every attention score", f, type);
  }
}

Resolution resolve(const std::string& file, const json& c) {
  Resolution r;
  r.file = file;
  std::string arch;
  if (auto it = c.find("architectures"); it != c.end() && it->is_array() && !it->empty() && (*it)[0].is_string())
    arch = (*it)[0].get<std::string>();
  const std::string model_type = c.value("model_type", std::string());
  const bool llama = arch == "LlamaForCausalLM" || (arch.empty() && model_type == "llama");
  const bool qwen2_moe = arch == "Qwen2MoeForCausalLM" || (arch.empty() && model_type == "qwen2_moe");
  const bool qwen2 = qwen2_moe || arch == "Qwen2ForCausalLM" || (arch.empty() && model_type == "qwen2");
  const bool qwen3_moe = arch == "Qwen3MoeForCausalLM" || (arch.empty() && model_type == "qwen3_moe");
  const bool qwen3 = qwen3_moe || arch == "Qwen3ForCausalLM" || (arch.empty() && model_type == "qwen3");
  const bool mixtral = arch == "MixtralForCausalLM" || (arch.empty() && model_type == "mixtral");
  if (!llama && !qwen2 && !qwen3 && !mixtral) {
    r.fail("architecture '{}' (model_type '{}') is not supported: LlamaForCausalLM, Qwen2ForCausalLM, "
           "Qwen3ForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM", arch, model_type);
    return r;
  }
  auto required = [&](const char* field, const char* key) {  // a positive integer
    if (auto v = get_int(c, field); v && *v > 0) r.set(key, *v, field);
    else if (v) r.fail("'{}' = {} must be positive", field, *v);
    else r.fail("no '{}'", field);
  };
  required("vocab_size", "model.vocab_size");
  required("hidden_size", "model.hidden_size");
  required("num_hidden_layers", "model.n_layers");
  required("num_attention_heads", "model.n_heads");
  required("intermediate_size", "model.intermediate_size");
  const int64_t heads = get_int(c, "num_attention_heads").value_or(1);
  const int64_t kv_heads = get_int(c, "num_key_value_heads").value_or(heads);
  if (kv_heads <= 0) r.fail("'num_key_value_heads' = {} must be positive", kv_heads);
  else r.set("model.n_kv_heads", kv_heads, c.contains("num_key_value_heads") ? "num_key_value_heads" : "num_attention_heads");
  if (auto hd = get_int(c, "head_dim"); hd && *hd <= 0) r.fail("'head_dim' = {} must be positive", *hd);
  else if (hd) r.set("model.head_dim", *hd, "head_dim");
  else if (qwen3) r.set("model.head_dim", int64_t(128), "head_dim (Qwen3's default)");
  if (auto n = get_int(c, "max_position_embeddings")) r.set("model.max_seq_len", *n, "max_position_embeddings");
  resolve_rope(c, r);
  r.set("model.rms_norm_eps", get_float(c, "rms_norm_eps").value_or(1e-6), "rms_norm_eps");
  r.set("model.tie_word_embeddings", get_bool(c, "tie_word_embeddings").value_or(false), "tie_word_embeddings");
  if (qwen2_moe) {
    r.set("model.qkv_bias", get_bool(c, "qkv_bias").value_or(true), "qkv_bias");
    r.set("model.o_bias", false, "architectures (Qwen2-MoE: no o bias)");
  } else if (qwen2) {
    r.set("model.qkv_bias", true, "architectures (Qwen2: q/k/v biases)");
    r.set("model.o_bias", false, "architectures (Qwen2: no o bias)");
  } else {
    const bool bias = get_bool(c, "attention_bias").value_or(false);
    r.set("model.qkv_bias", bias, "attention_bias");
    r.set("model.o_bias", bias, "attention_bias");
  }
  r.set("model.qk_norm", qwen3, qwen3 ? "architectures (Qwen3: q_norm/k_norm)" : "architectures (no q/k norms)");

  // Fields that change the math and that this model does not implement.
  const std::string act = c.value("hidden_act", std::string("silu"));
  if (act != "silu") r.fail("hidden_act '{}' is not supported (silu)", act);
  if (get_bool(c, "mlp_bias").value_or(false)) r.fail("mlp_bias = true is not supported");
  if (get_bool(c, "use_sliding_window").value_or(false)) r.fail("use_sliding_window = true is not supported");
  if (auto it = c.find("layer_types"); it != c.end() && it->is_array())
    for (const auto& t : *it)
      if (t != "full_attention") {
        r.fail("layer_types has '{}' layers: only full_attention is supported", t.dump());
        break;
      }
  if (get_float(c, "attention_dropout").value_or(0.0) != 0.0) r.fail("attention_dropout != 0 is not supported");
  if (get_float(c, "partial_rotary_factor").value_or(1.0) != 1.0) r.fail("partial_rotary_factor != 1 is not supported");
  if (mixtral) {
    // Every layer sparse; intermediate_size is each expert's width; the top-k
    // probabilities always renormalised; no shared expert.
    required("num_local_experts", "model.n_experts");
    required("num_experts_per_tok", "model.n_experts_per_tok");
    required("intermediate_size", "model.moe_intermediate_size");
    r.set("model.norm_topk_prob", true, "architectures (Mixtral: top-k probabilities renormalised)");
    r.set("model.moe_layer_freq", int64_t(1), "architectures (Mixtral: every layer sparse)");
    r.set("model.shared_expert_intermediate_size", int64_t(0), "architectures (Mixtral: no shared expert)");
    if (auto w = get_int(c, "sliding_window"); w && *w < get_int(c, "max_position_embeddings").value_or(0))
      r.fail("sliding_window = {} is not supported (attention over the whole context; null or >= "
             "max_position_embeddings has no effect)", *w);
    if (get_float(c, "router_jitter_noise").value_or(0.0) != 0.0)
      r.fail("router_jitter_noise != 0 is not supported (the router's logits are used as they are)");
  } else if (qwen3_moe || qwen2_moe) {
    // transformers 5 names the expert count num_local_experts, 4 num_experts.
    const char* experts = c.contains("num_local_experts") ? "num_local_experts" : "num_experts";
    required(experts, "model.n_experts");
    required("num_experts_per_tok", "model.n_experts_per_tok");
    required("moe_intermediate_size", "model.moe_intermediate_size");
    r.set("model.norm_topk_prob", get_bool(c, "norm_topk_prob").value_or(false), "norm_topk_prob");
    if (auto step = get_int(c, "decoder_sparse_step"); step && *step <= 0)
      r.fail("'decoder_sparse_step' = {} must be positive", *step);
    else r.set("model.moe_layer_freq", step.value_or(1), "decoder_sparse_step");
    if (auto it = c.find("mlp_only_layers"); it != c.end() && it->is_array() && !it->empty())
      r.fail("mlp_only_layers = {} is not supported (every (l + 1) % decoder_sparse_step == 0 layer is sparse)",
             it->dump());
    if (qwen2_moe) required("shared_expert_intermediate_size", "model.shared_expert_intermediate_size");
    else r.set("model.shared_expert_intermediate_size", int64_t(0), "architectures (Qwen3-MoE: no shared expert)");
  } else {
    for (const char* moe : {"num_experts", "num_local_experts", "n_routed_experts"})
      if (get_int(c, moe).value_or(0) > 0)
        r.fail("'{}' > 0: of the mixture-of-experts architectures only Qwen2MoeForCausalLM, Qwen3MoeForCausalLM "
               "and MixtralForCausalLM are supported", moe);
  }
  return r;
}

// Deck keys whose value 0 stands for another key's value.
bool same_meaning(const std::string& key, const DeckValue& deck, const DeckValue& config,
                  const std::map<std::string, DeckEntry>& entries) {
  if (same_value(deck, config)) return true;
  if (key == "model.n_kv_heads" && deck == DeckValue(int64_t(0)))
    return config == entries.at("model.n_heads").value;
  return false;
}

// tokenizer.path "" -> model.init_from's directory when it holds a tokenizer.json, else
// "bytes"; a path given is checked to exist.
void resolve_tokenizer(std::map<std::string, DeckEntry>& entries, std::vector<std::string>& problems) {
  auto tok = entries.find("tokenizer.path");
  if (tok == entries.end()) return;
  std::string& path = std::get<std::string>(tok->second.value);
  if (path.empty()) {
    const std::string& init = std::get<std::string>(entries.at("model.init_from").value);
    if (!init.empty() && std::filesystem::exists(std::filesystem::path(init) / "tokenizer.json")) {
      tok->second = {init, "model.init_from (" + entries.at("model.init_from").source + ") holds tokenizer.json"};
    } else {
      tok->second = {std::string("bytes"), "default"};
    }
    return;
  }
  if (path == "bytes") return;
  const bool ok = std::filesystem::is_directory(path) ? std::filesystem::exists(std::filesystem::path(path) / "tokenizer.json")
                                                      : std::filesystem::exists(path);
  if (!ok)
    problems.push_back(fmt::format("tokenizer.path = \"{}\" ({}): no tokenizer.json there (\"bytes\" = slimpi's "
                                   "byte tokenizer)",
                                   path, tok->second.source));
}

}  // namespace

void apply_hf_config(std::map<std::string, DeckEntry>& entries, std::vector<std::string>& problems) {
  resolve_tokenizer(entries, problems);
  auto init = entries.find("model.init_from");
  if (init == entries.end()) return;
  const std::string* path = std::get_if<std::string>(&init->second.value);
  if (!path || path->empty() || !std::filesystem::is_directory(*path)) return;
  const std::string file = (std::filesystem::path(*path) / "config.json").string();
  if (!std::filesystem::exists(file)) {
    // Without config.json the deck's [model] keys (defaults, mostly) would be taken as
    // the shape of weights that were never made for them.
    std::string weights;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(*path, ec))
      if (entry.path().extension() == ".safetensors" || entry.path().filename() == "model.safetensors.index.json") {
        weights = entry.path().filename().string();
        if (weights == "model.safetensors") break;
      }
    problems.push_back(fmt::format("{} has {} but no config.json (model.init_from, {}): a Hugging Face directory "
                                   "needs its config.json for the model's shape; to load bare weights with the "
                                   "deck's [model] keys, point model.init_from at the .safetensors file",
                                   *path, weights.empty() ? "no weights (*.safetensors)" : weights,
                                   init->second.source));
    return;
  }
  json c;
  try {
    std::ifstream in(file);
    c = json::parse(in);
  } catch (const std::exception& e) {
    problems.push_back(fmt::format("{} (model.init_from, {}): not valid JSON: {}", file, init->second.source, e.what()));
    return;
  }
  Resolution r;
  try {
    r = resolve(file, c);
  } catch (const std::exception& e) {
    problems.push_back(fmt::format("{}: {}", file, e.what()));
    return;
  }
  for (auto& p : r.problems) problems.push_back(p + fmt::format(" (model.init_from, {})", init->second.source));
  // A deck value the config overrides would be silently different: compare first.
  for (const auto& [key, value, field] : r.keys) {
    DeckEntry& e = entries.at(key);
    if (e.source == "default" || same_meaning(key, e.value, value, entries)) continue;
    if (key == "model.max_seq_len" && std::get<int64_t>(e.value) <= std::get<int64_t>(value)) {
      // Training at a shorter context than the model supports is a real use: allowed, said.
      log::info("model.max_seq_len = {} ({}) is below {} = {} in {}: the run uses the shorter context",
                std::get<int64_t>(e.value), e.source, field, std::get<int64_t>(value), file);
      continue;
    }
    problems.push_back(fmt::format("{} = {} ({}) contradicts {} = {} in {}: drop the key or make them agree", key,
                                   value_text(e.value), e.source, field, value_text(value), file));
  }
  for (const auto& [key, value, field] : r.keys) {
    DeckEntry& e = entries.at(key);
    if (e.source == "default") e = {value, fmt::format("{} ({})", file, field)};
  }
}

}  // namespace slimpi
