#include "ckpt/hf_export.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "arch/architecture.h"
#include "arch/mtp_names.h"
#include "ckpt/checkpoint_dir.h"
#include "ckpt/export_source.h"
#include "core/file_write.h"
#include "io/safetensors.h"
#include "io/tensor_io.h"
#include "model/linear_channels.h"
#include "model/transformer.h"
#include <slimpi/deck.h>

#include "tokenizer/byte_tokenizer.h"
#include "tokenizer/hf_tokenizer.h"

namespace slimpi {

namespace {
void add_special_ids(nlohmann::json& j, const HfSpecialIds& ids);
}

int64_t parse_byte_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string unit = text.substr(digits);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int64_t scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "KB") scale = int64_t(1) << 10;
  else if (unit == "MB") scale = int64_t(1) << 20;
  else if (unit == "GB") scale = int64_t(1) << 30;
  SLIMPI_CHECK(digits > 0 && digits <= 12 && scale > 0, "size '{}': expected a number with B, KB, MB or GB", text);
  const int64_t bytes = std::stoll(text.substr(0, digits)) * scale;
  SLIMPI_CHECK(bytes > 0, "size '{}' must be positive", text);
  return bytes;
}

std::string hf_config_json(const ModelConfig& cfg, const std::string& dtype, const HfSpecialIds& ids) {
  SLIMPI_CHECK(cfg.qkv_bias || !cfg.o_bias,
               "an o_proj bias without q/k/v biases has no Hugging Face architecture");
  const bool shared = cfg.shared_expert_intermediate_size > 0;
  const Architecture* arch = export_architecture(cfg);  // arch/architecture.h: at most one fits
  SLIMPI_CHECK(arch || !cfg.is_hybrid(),
               "this hybrid linear-attention model has no Hugging Face architecture to export to: Qwen3_5ForCausalLM "
               "and Qwen3_5MoeForCausalLM need model.qk_norm, model.attn_output_gate and model.zero_centered_norm = "
               "true and Qwen3.5's separate projections (the MoE: every layer sparse, a gated shared expert, "
               "model.norm_topk_prob = true, softmax routing); Qwen3NextForCausalLM the same with "
               "model.linear_fused_projections = true, a gated shared expert and softmax routing; each at most one MTP "
               "layer "
               "(this model: qk_norm {}, attn_output_gate {}, zero_centered_norm {}, linear_fused_projections {}, "
               "{} experts, shared expert width {}, mtp_num_layers {})",
               cfg.qk_norm, cfg.attn_output_gate, cfg.zero_centered_norm, cfg.linear_fused_projections, cfg.n_experts,
               cfg.shared_expert_intermediate_size, cfg.mtp_num_layers);
  SLIMPI_CHECK(arch || cfg.is_hybrid() || !cfg.uses_deepseek_features(),
               "this model has no Hugging Face architecture to export to: DeepSeekMoE routing (model.moe_router = "
               "\"sigmoid\", shared experts, dense first layers), partial RoPE or latent attention export as "
               "Glm4MoeForCausalLM or DeepseekV3ForCausalLM only: a mixture of experts with model.moe_router = "
               "\"sigmoid\", model.moe_router_bias = true, model.moe_layer_freq = 1, no gated shared expert and no o "
               "bias (DeepseekV3ForCausalLM: with model.kv_lora_rank > 0)");
  if (!arch) {
    std::vector<std::string> why;  // what keeps this model from the architecture closest to it
    if (cfg.qk_norm) {
      why.push_back("q/k norms with a shared expert (Qwen3-MoE has no shared expert, Qwen2-MoE no q/k norms)");
    } else if (shared) {
      why.push_back("a shared expert with model.o_bias = true (Qwen2-MoE has no o bias)");
    } else {  // Mixtral's shape but for
      if (cfg.qkv_bias || cfg.o_bias) why.push_back("attention biases (Mixtral has none)");
      if (cfg.moe_layer_freq != 1)
        why.push_back(fmt::format("model.moe_layer_freq = {} (Mixtral: every layer sparse)", cfg.moe_layer_freq));
      if (!cfg.norm_topk_prob) why.push_back("model.norm_topk_prob = false (Mixtral renormalises the top-k)");
    }
    SLIMPI_FAIL("this mixture-of-experts model has no Hugging Face architecture to export to: {}. Exportable: "
                "Qwen3MoeForCausalLM (model.qk_norm = true, no shared expert), Qwen2MoeForCausalLM (a shared expert, "
                "no q/k norms, no o bias), MixtralForCausalLM (no q/k norms, shared expert or biases, every layer "
                "sparse, model.norm_topk_prob = true)", fmt::join(why, "; "));
  }
  SLIMPI_CHECK(!cfg.qk_norm || arch->deepseek_moe || cfg.qkv_bias == cfg.o_bias,
               "Qwen3 has biases on all of q/k/v/o or none (model.qkv_bias = {}, model.o_bias = {})",
               cfg.qkv_bias, cfg.o_bias);
  nlohmann::json j = {
      {"architectures", {arch->hf_class}},
      {"model_type", arch->model_type},
      {"vocab_size", cfg.vocab_size},
      {"hidden_size", cfg.hidden_size},
      {"intermediate_size", cfg.intermediate_size},
      {"num_hidden_layers", cfg.n_layers},
      {"num_attention_heads", cfg.n_heads},
      {"num_key_value_heads", cfg.n_kv_heads},
      {"head_dim", cfg.head_dim()},
      {"max_position_embeddings", cfg.max_seq_len},
      {"rms_norm_eps", cfg.rms_norm_eps},
      {"rope_theta", cfg.rope_theta},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", cfg.tie_word_embeddings},
      {"torch_dtype", dtype == "bf16" ? "bfloat16" : "float32"},
  };
  add_special_ids(j, ids);
  if (ids.bytes) j["slimpi_tokenizer"] = "bytes: ids 0-255 are UTF-8 bytes, 256 PAD, 257 BOS, 258 EOS";
  arch->write_config(cfg, j);  // the family's own fields
  if (cfg.mtp_num_layers > 0) j["num_nextn_predict_layers"] = cfg.mtp_num_layers;  // DeepSeek-V3's and MiMo's key
  if (cfg.rope_scaling == "linear") {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", cfg.rope_factor}};
  } else if (cfg.rope_scaling == "yarn") {
    nlohmann::json y = {{"rope_type", "yarn"}, {"factor", cfg.rope_factor},
                        {"original_max_position_embeddings", cfg.rope_original_max_seq_len},
                        {"beta_fast", cfg.rope_beta_fast}, {"beta_slow", cfg.rope_beta_slow},
                        {"truncate", cfg.rope_truncate}};
    if (cfg.rope_mscale > 0) y["mscale"] = cfg.rope_mscale;
    if (cfg.rope_mscale_all_dim > 0) y["mscale_all_dim"] = cfg.rope_mscale_all_dim;
    if (cfg.rope_attention_factor > 0) y["attention_factor"] = cfg.rope_attention_factor;
    j["rope_scaling"] = y;
  } else if (cfg.rope_scaling == "llama3") {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", cfg.rope_factor},
                         {"low_freq_factor", cfg.rope_low_freq_factor},
                         {"high_freq_factor", cfg.rope_high_freq_factor},
                         {"original_max_position_embeddings", cfg.rope_original_max_seq_len}};
  }
  return j.dump(2) + "\n";
}

namespace {

void add_special_ids(nlohmann::json& j, const HfSpecialIds& ids) {
  j["bos_token_id"] = ids.bos ? nlohmann::json(*ids.bos) : nlohmann::json(nullptr);
  j["pad_token_id"] = ids.pad ? nlohmann::json(*ids.pad) : nlohmann::json(nullptr);
  j["eos_token_id"] = ids.eos.size() == 1 ? nlohmann::json(ids.eos[0]) : nlohmann::json(ids.eos);
}

std::string generation_config_json(const HfSpecialIds& ids) {
  nlohmann::json j = nlohmann::json::object();
  add_special_ids(j, ids);
  return j.dump(2) + "\n";
}

// The tokenizer the checkpoint's run used: its special ids, and the files to copy.
HfSpecialIds special_ids_of(const std::string& tokenizer_path, std::vector<std::filesystem::path>& files) {
  HfSpecialIds ids;
  if (tokenizer_path == "bytes") return ids;  // the defaults: slimpi's byte ids
  const auto tok = make_tokenizer(tokenizer_path);
  const auto& hf = dynamic_cast<const HfTokenizer&>(*tok);
  ids.bytes = false;
  ids.eos = hf.stop_ids();
  ids.bos = hf.bos_id();
  ids.pad = hf.pad_id();
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
    if (std::filesystem::exists(hf.directory() / name)) files.push_back(hf.directory() / name);
  return ids;
}

// Whole tensors in order, a new shard when the next tensor would pass max_bytes.
std::vector<std::vector<NamedTensor>> shard(const std::vector<NamedTensor>& tensors, int64_t max_bytes) {
  std::vector<std::vector<NamedTensor>> shards(1);
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    const int64_t b = t.tensor.numel() * t.tensor.element_size();
    if (!shards.back().empty() && bytes + b > max_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(t);
    bytes += b;
  }
  return shards;
}

}  // namespace

std::string export_checkpoint_to_hf(const std::string& path, const std::string& out_dir,
                                    const HfExportOptions& options) {
  SLIMPI_CHECK(options.dtype == "fp32" || options.dtype == "bf16", "--dtype {} (fp32 or bf16)", options.dtype);
  const ckpt::ExportSource source = ckpt::find_export_source(path);
  ckpt::check_export_destination(source, out_dir);
  const std::string& ckpt_dir = source.checkpoint_dir;
  const Deck deck = ckpt::read_checkpoint_deck(ckpt_dir);
  const ModelConfig cfg = ModelConfig::from_deck(deck);
  std::vector<std::filesystem::path> tokenizer_files;  // (older checkpoints read as "bytes": read_checkpoint_deck)
  const HfSpecialIds ids = special_ids_of(deck.get_string("tokenizer.path"), tokenizer_files);
  Transformer model(cfg, /*seed=*/0, at::Device(at::kCPU));
  load_model_weights(model.parameters(), source.weights, "model", false, StoredWhole{&cfg, {}});
  const std::string config = hf_config_json(cfg, options.dtype, ids);

  std::vector<NamedTensor> tensors;
  int64_t total = 0;
  const Architecture* arch = export_architecture(cfg);  // (hf_config_json refused a model none fits)
  for (const auto& p : model.parameters()) {
    at::Tensor t = p.tensor.detach();
    if (options.dtype == "bf16") t = t.to(at::kBFloat16);
    if (holds_linear_channels(p.name, cfg)) t = linear_channels_to_hf(t, cfg);  // (grouped by key head in slimpi)
    if (arch->file_shape) t = t.reshape(arch->file_shape(p.name, t.sizes().vec()));
    std::string name = arch->tensor_name ? arch->tensor_name(p.name) : p.name;  // the family's file names
    if (is_mtp_parameter(p.name) && arch->mtp_layout != Architecture::MtpLayout::Slimpi) {  // (arch/mtp_names.h)
      name = arch->mtp_layout == Architecture::MtpLayout::Qwen ? qwen_mtp_name(p.name)
                                                                : deepseek_mtp_name(p.name, cfg.n_layers);
      if (is_mtp_input_proj(p.name)) t = swap_input_proj_halves(t);  // [h ; emb] -> [emb ; h]
    }
    tensors.push_back({name, t});
    total += t.numel() * t.element_size();
  }
  std::filesystem::create_directories(out_dir);
  for (const auto& entry : std::filesystem::directory_iterator(out_dir)) {  // no stale shards of an earlier export
    const std::string name = entry.path().filename().string();
    const bool weights = entry.path().extension() == ".safetensors" || name == "model.safetensors.index.json";
    if (name.rfind("model", 0) == 0 && weights)
      std::filesystem::remove(entry.path());
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"source", source.weights}};
  const auto shards = shard(tensors, options.max_shard_bytes);
  std::string files;
  std::vector<std::string> written;  // removed again when the export fails part way (a full disk)
  try {
    if (shards.size() == 1) {
      written.push_back(out_dir + "/model.safetensors");
      write_safetensors(written.back(), tensors, meta);
      files = "model.safetensors";
    } else {
      nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", nlohmann::json::object()}};
      for (size_t i = 0; i < shards.size(); ++i) {
        const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
        written.push_back(out_dir + "/" + name);
        write_safetensors(written.back(), shards[i], meta);
        for (const auto& t : shards[i]) index["weight_map"][t.name] = name;
      }
      written.push_back(out_dir + "/model.safetensors.index.json");
      write_file(written.back(), index.dump(2) + "\n");
      files = fmt::format("{} shards + model.safetensors.index.json", shards.size());
    }
    written.push_back(out_dir + "/config.json");
    write_file(written.back(), config);
    written.push_back(out_dir + "/generation_config.json");
    write_file(written.back(), generation_config_json(ids));
  } catch (const std::exception& e) {
    for (const auto& path : written) {
      std::error_code ignored;
      std::filesystem::remove(path, ignored);
    }
    SLIMPI_FAIL("{} (the export's files written so far were removed: {} holds no partial model)", e.what(), out_dir);
  }
  for (const auto& f : tokenizer_files) {  // the tokenizer the run trained with, as it came
    const std::filesystem::path to = std::filesystem::path(out_dir) / f.filename();
    if (!std::filesystem::exists(to) || !std::filesystem::equivalent(f, to))
      std::filesystem::copy_file(f, to, std::filesystem::copy_options::overwrite_existing);
  }
  if (!tokenizer_files.empty()) files += fmt::format(" + {} tokenizer files", tokenizer_files.size());
  return fmt::format("export: {} -> {}/ {} ({} tensors, {} parameters, {}) + config.json + generation_config.json",
                     source.description, out_dir, files, model.parameters().size(), model.n_params(), options.dtype);
}

}  // namespace slimpi
