#include "config/hf_config.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "arch/architecture.h"
#include "arch/hf_config_reader.h"
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

// The pretraining length of a llama3 or yarn RoPE, as transformers' standardize_rope_params
// takes it: a top-level original_max_position_embeddings first (Phi-3's and some DeepSeek
// conversions' place for it), else the scaling object's, else max_position_embeddings.
struct OriginalLength {
  std::optional<int64_t> tokens;
  std::string source;
};
OriginalLength original_length(const json& c, const json& scaling, const std::string& f) {
  if (auto top = get_int(c, "original_max_position_embeddings")) return {top, "original_max_position_embeddings"};
  if (auto own = get_int(scaling, "original_max_position_embeddings"))
    return {own, f + ".original_max_position_embeddings"};
  return {get_int(c, "max_position_embeddings"), "max_position_embeddings"};
}

// Multi-head latent attention's softmax scale grows by YaRN's mscale(factor,
// mscale_all_dim)² under any rope type but the default (transformers' yarn_apply_mscale):
// read for linear and llama3 too.
void read_mscale_all_dim(const json& y, const std::string& f, HfConfigReader& r) {
  if (auto v = get_float(y, "mscale_all_dim"); v && *v < 0) r.fail("{}.mscale_all_dim = {} must not be negative", f, *v);
  else if (v && *v > 0) r.set("model.rope_mscale_all_dim", *v, f + ".mscale_all_dim");
}

// YaRN's fields (ModelConfig's rope_* keys): the pretraining length (original_length) and
// factor (absent: max_position_embeddings over that length, as DeepSeek's configs allow),
// the rest transformers' defaults when absent.
void read_yarn(const json& c, const json& y, const std::string& f, HfConfigReader& r) {
  r.set("model.rope_scaling", std::string("yarn"), f + ".rope_type");
  const OriginalLength original = original_length(c, y, f);
  if (!original.tokens || *original.tokens <= 0) {
    r.fail("{} of type yarn needs a positive 'original_max_position_embeddings' (or max_position_embeddings)", f);
    return;
  }
  auto factor = get_float(y, "factor");
  std::string factor_source = f + ".factor";
  if (!factor && get_int(c, "max_position_embeddings")) {
    factor = double(*get_int(c, "max_position_embeddings")) / double(*original.tokens);
    factor_source = "max_position_embeddings / " + original.source;
  }
  if (!factor || *factor <= 0) {
    r.fail("{} of type yarn needs a positive 'factor'", f);
    return;
  }
  r.set("model.rope_factor", *factor, factor_source);
  r.set("model.rope_original_max_seq_len", *original.tokens, original.source);
  for (const auto& [field, key] :
       {std::pair{"beta_fast", "model.rope_beta_fast"}, {"beta_slow", "model.rope_beta_slow"},
        {"mscale", "model.rope_mscale"}, {"attention_factor", "model.rope_attention_factor"}})
    if (auto v = get_float(y, field); v && *v < 0) r.fail("{}.{} = {} must not be negative", f, field, *v);
    else if (v && *v > 0) r.set(key, *v, f + "." + field);
  read_mscale_all_dim(y, f, r);
  if (auto t = get_bool(y, "truncate")) r.set("model.rope_truncate", *t, f + ".truncate");
}

void resolve_rope(const json& c, HfConfigReader& r) {
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
  } else if (type == "yarn") {
    read_yarn(c, *scaling, f, r);
  } else if (type == "linear" || type == "llama3") {
    r.set("model.rope_scaling", type, f + ".rope_type");
    auto factor = get_float(*scaling, "factor");
    if (!factor || *factor <= 0) r.fail("{} of type {} needs a positive 'factor'", f, type);
    else r.set("model.rope_factor", *factor, f + ".factor");
    read_mscale_all_dim(*scaling, f, r);
    if (type == "llama3") {
      auto low = get_float(*scaling, "low_freq_factor"), high = get_float(*scaling, "high_freq_factor");
      const OriginalLength original = original_length(c, *scaling, f);
      if (!low || !high || !original.tokens)
        r.fail("{} of type llama3 needs low_freq_factor, high_freq_factor and original_max_position_embeddings", f);
      else {
        r.set("model.rope_low_freq_factor", *low, f + ".low_freq_factor");
        r.set("model.rope_high_freq_factor", *high, f + ".high_freq_factor");
        r.set("model.rope_original_max_seq_len", *original.tokens, original.source);
      }
    }
  } else {
    r.fail("{} type '{}' is not supported (default, linear, llama3, yarn): it changes every attention score", f, type);
  }
}

// Fields that change the math and that this model does not implement (any family).
void refuse_unsupported_fields(const json& c, HfConfigReader& r, bool hybrid) {
  const std::string act = c.value("hidden_act", std::string("silu"));
  if (act != "silu") r.fail("hidden_act '{}' is not supported (silu)", act);
  if (get_bool(c, "mlp_bias").value_or(false)) r.fail("mlp_bias = true is not supported");
  if (get_bool(c, "use_sliding_window").value_or(false)) r.fail("use_sliding_window = true is not supported");
  if (auto it = c.find("layer_types"); it != c.end() && it->is_array() && !hybrid)  // (hybrid families read their own)
    for (const auto& t : *it)
      if (t != "full_attention") {
        r.fail("layer_types has '{}' layers: only full_attention is supported", t.dump());
        break;
      }
  if (get_float(c, "attention_dropout").value_or(0.0) != 0.0) r.fail("attention_dropout != 0 is not supported");
  // (the families that rotate part of each head read it themselves)
  if (const auto f = find_partial_rotary_factor(c); !r.has("model.partial_rotary_factor") && f && f->first != 1.0)
    r.fail("{} = {}: partial_rotary_factor != 1 is not supported for this architecture", f->second, f->first);
  // Block-wise FP8 checkpoints (model/fp8_blocks.h) load de-quantised; other schemes are refused.
  if (auto q = c.find("quantization_config"); q != c.end() && !q->is_null()) {
    const std::string method = q->value("quant_method", std::string("?"));
    const json block = q->value("weight_block_size", json::array({128, 128}));
    if (method != "fp8")
      r.fail("quantization_config.quant_method '{}' is not supported (fp8, block-wise e4m3)", method);
    else if (q->value("fmt", std::string("e4m3")) != "e4m3")
      r.fail("quantization_config.fmt '{}' is not supported (e4m3)", q->value("fmt", std::string()));
    else if (block != json::array({128, 128}))
      r.fail("quantization_config.weight_block_size {} is not supported ([128, 128])", block.dump());
    else if (q->value("activation_scheme", std::string("dynamic")) != "dynamic")
      r.fail("quantization_config.activation_scheme '{}' is not supported (dynamic)",
             q->value("activation_scheme", std::string()));
  }
}

// The fields every family has, then the family's own (arch/architecture.h), then the
// fields that change the math and that this model does not implement.
HfConfigReader resolve(const std::string& file, const json& top) {
  HfConfigReader r;
  r.file = file;
  std::string hf_class;
  if (auto it = top.find("architectures"); it != top.end() && it->is_array() && !it->empty() && (*it)[0].is_string())
    hf_class = (*it)[0].get<std::string>();
  const std::string model_type = top.value("model_type", std::string());
  const Architecture* arch = architecture_of_config(hf_class, model_type);
  if (!arch) {
    r.fail("architecture '{}' (model_type '{}') is not supported: {}", hf_class, model_type, architecture_classes());
    return r;
  }
  // A multimodal class: the text model's fields are text_config's.
  if (arch->nested_text_config && !(top.contains("text_config") && top["text_config"].is_object())) {
    r.fail("{} keeps its text model's fields in 'text_config', and this config has none", arch->hf_class);
    return r;
  }
  const json& c = arch->nested_text_config ? top["text_config"] : top;
  if (arch->nested_text_config) r.file = file + " text_config";
  r.required(c, "vocab_size", "model.vocab_size");
  r.required(c, "hidden_size", "model.hidden_size");
  r.required(c, "num_hidden_layers", "model.n_layers");
  r.required(c, "num_attention_heads", "model.n_heads");
  if (!arch->no_dense_layers || c.contains("intermediate_size"))
    r.required(c, "intermediate_size", "model.intermediate_size");
  const int64_t heads = get_int(c, "num_attention_heads").value_or(1);
  const int64_t kv_heads = get_int(c, "num_key_value_heads").value_or(heads);
  if (kv_heads <= 0) r.fail("'num_key_value_heads' = {} must be positive", kv_heads);
  else r.set("model.n_kv_heads", kv_heads, c.contains("num_key_value_heads") ? "num_key_value_heads" : "num_attention_heads");
  if (auto hd = get_int(c, "head_dim"); hd && *hd <= 0) r.fail("'head_dim' = {} must be positive", *hd);
  else if (hd) r.set("model.head_dim", *hd, "head_dim");
  if (auto n = get_int(c, "max_position_embeddings")) r.set("model.max_seq_len", *n, "max_position_embeddings");
  resolve_rope(c, r);
  r.set("model.rms_norm_eps", get_float(c, "rms_norm_eps").value_or(1e-6), "rms_norm_eps");
  r.set("model.tie_word_embeddings", get_bool(c, "tie_word_embeddings").value_or(false), "tie_word_embeddings");
  // Multi-token prediction depths, where the config has them (DeepSeek-V3, MiMo and GLM
  // name them num_nextn_predict_layers, Qwen3.5 and Qwen3-Next mtp_num_hidden_layers,
  // others num_mtp_layers); a config without any leaves model.mtp_num_layers to the deck
  // (fresh MTP layers for a model without them).
  for (const char* field : {"num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers"})
    if (auto n = get_int(c, field)) {
      if (*n < 0) r.fail("'{}' = {} must not be negative", field, *n);
      else r.set("model.mtp_num_layers", *n, field);
      break;
    }
  arch->read_config(c, r);
  refuse_unsupported_fields(c, r, arch->hybrid);
  // What a family leaves unset is the plain model's (softmax routing, whole rotary heads,
  // no latent attention): a deck that sets one of these otherwise would change the
  // checkpoint's math, which apply_hf_config then refuses as a contradiction.
  const std::vector<std::pair<const char*, DeckValue>> plain = {
      {"model.moe_router", std::string("softmax")}, {"model.moe_router_bias", false},
      {"model.moe_n_group", int64_t(1)}, {"model.moe_topk_group", int64_t(1)},
      {"model.moe_routed_scaling_factor", 1.0}, {"model.n_shared_experts", int64_t(0)},
      {"model.first_k_dense_replace", int64_t(0)}, {"model.partial_rotary_factor", 1.0},
      {"model.kv_lora_rank", int64_t(0)}, {"model.q_lora_rank", int64_t(0)}, {"model.rope_interleave", false},
      {"model.full_attention_interval", int64_t(1)}, {"model.attn_output_gate", false},
      {"model.linear_fused_projections", false},
      {"model.zero_centered_norm", false}};
  for (const auto& [key, value] : plain)
    if (!r.has(key)) r.set(key, value, "architectures (" + std::string(arch->hf_class) + ": none)");
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
  HfConfigReader r;
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
    if (key == "model.mtp_num_layers" && std::get<int64_t>(e.value) == 0) {
      // Leaving the checkpoint's MTP layers out (memory, a model that never drafts): allowed, said.
      log::info("model.mtp_num_layers = 0 ({}): the {} MTP layer(s) of {} ({}) are not loaded", e.source,
                std::get<int64_t>(value), file, field);
      continue;
    }
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
