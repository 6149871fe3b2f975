// Hugging Face export of a checkpoint: `slimpi export PATH OUT_DIR` (PATH: a checkpoint,
// a checkpoint root, a run directory or a trainer_state.h5) writes
//   OUT_DIR/config.json             LlamaForCausalLM, Qwen2ForCausalLM (q/k/v biases, no o
//                                   bias) or Qwen3ForCausalLM (q/k norms), from the
//                                   checkpoint's deck.json [model] keys
//   OUT_DIR/generation_config.json  bos/eos/pad token ids
//   OUT_DIR/model.safetensors       the policy's parameters under their HF names, or
//   OUT_DIR/model-0000i-of-0000N.safetensors + model.safetensors.index.json above
//                                   --max-shard-size (whole tensors, in parameter order)
// in fp32 or bf16 (--dtype; bf16 = the masters rounded once). The model is the
// checkpoint's trainer_state.h5 /model. RoPE uses HF's rotate-half layout, so the files
// load as they are; config.json writes rope_theta and rope_scaling at the top level
// (what transformers 4 writes and 5 still reads). A run on a Hugging Face tokenizer
// (tokenizer.path) gets its tokenizer.json, tokenizer_config.json and
// special_tokens_map.json copied, and their special ids; a byte-tokenizer run records
// the byte ids (0-255 = bytes, 256 PAD, 257 BOS, 258 EOS) in config.json.
// model.init_from accepts OUT_DIR back (config.json then supplies the [model] keys).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace slimpi {

// The special ids config.json and generation_config.json name: the byte tokenizer's by
// default; a Hugging Face tokenizer's from its files.
struct HfSpecialIds {
  bool bytes = true;
  std::optional<int64_t> bos = 257, pad = 256;
  std::vector<int64_t> eos = {258};
};

struct HfExportOptions {
  std::string dtype = "fp32";                      // fp32 | bf16
  int64_t max_shard_bytes = int64_t(5) << 30;      // one file up to this size, then shards
};

// "5GB", "500MB", "64KB", "123" (bytes) -> bytes; throws slimpi::Error on anything else.
int64_t parse_byte_size(const std::string& text);
// Throws when the config has no Hugging Face architecture (an o bias without q/k/v biases).
std::string hf_config_json(const ModelConfig& cfg, const std::string& dtype = "fp32", const HfSpecialIds& ids = {});
// Finds what `path` names (a checkpoint, a checkpoint root, a run directory or a
// trainer_state.h5: ckpt/export_source.h), verifies the checkpoint (manifest checksums)
// and writes OUT_DIR; returns a summary.
std::string export_checkpoint_to_hf(const std::string& path, const std::string& out_dir,
                                    const HfExportOptions& options = {});

}  // namespace slimpi
