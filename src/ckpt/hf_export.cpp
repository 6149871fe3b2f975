#include "ckpt/hf_export.h"

#include <slimpi/error.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint_dir.h"
#include "io/safetensors.h"
#include "io/tensor_io.h"
#include "model/transformer.h"
#include "tokenizer/byte_tokenizer.h"

namespace slimpi {

std::string hf_config_json(const ModelConfig& cfg) {
  const bool qwen = cfg.qkv_bias;
  nlohmann::json j = {
      {"architectures", {qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
      {"model_type", qwen ? "qwen2" : "llama"},
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
      {"torch_dtype", "float32"},
      {"pad_token_id", ByteTokenizer::kPad},
      {"bos_token_id", ByteTokenizer::kBos},
      {"eos_token_id", ByteTokenizer::kEos},
      {"slimpi_tokenizer", "bytes: ids 0-255 are UTF-8 bytes, 256 PAD, 257 BOS, 258 EOS"},
  };
  if (!qwen) j["attention_bias"] = false;
  return j.dump(2) + "\n";
}

std::string export_checkpoint_to_hf(const std::string& ckpt_dir, const std::string& out_dir) {
  if (auto problem = ckpt::verify_checkpoint(ckpt_dir))
    SLIMPI_FAIL("export: {} is not a usable checkpoint: {}", ckpt_dir, *problem);
  const ModelConfig cfg = ModelConfig::from_deck(ckpt::read_checkpoint_deck(ckpt_dir));
  Transformer model(cfg, /*seed=*/0, at::Device(at::kCPU));
  load_model_weights(model.parameters(), ckpt_dir + "/trainer_state.h5");

  std::filesystem::create_directories(out_dir);
  write_safetensors(out_dir + "/model.safetensors", model.parameters(), {{"format", "pt"}, {"source", ckpt_dir}});
  std::ofstream(out_dir + "/config.json") << hf_config_json(cfg);
  return fmt::format("export: {} -> {}/model.safetensors ({} tensors, {} parameters) + config.json", ckpt_dir,
                     out_dir, model.parameters().size(), model.n_params());
}

}  // namespace slimpi
