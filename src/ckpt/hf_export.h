// Hugging Face export of a checkpoint: `slimpi export CKPT_DIR OUT_DIR` writes
//   OUT_DIR/model.safetensors   the policy's parameters under their HF names (fp32)
//   OUT_DIR/config.json         LlamaForCausalLM (Qwen2ForCausalLM when model.qkv_bias)
// The model is the checkpoint's trainer_state.h5 /model; its shape comes from the
// checkpoint's deck.json. RoPE uses HF's rotate-half layout, so the files load as they
// are. The tokenizer is slimpi's byte tokenizer (ids 0-255 = bytes, 256 PAD, 257 BOS,
// 258 EOS), recorded in config.json; HF has no stock tokenizer file for it.
// model.init_from accepts OUT_DIR (or the .safetensors file) back.
#pragma once

#include <string>

#include "model/model_config.h"

namespace slimpi {

std::string hf_config_json(const ModelConfig& cfg);
// Verifies the checkpoint (manifest checksums) and writes OUT_DIR; returns a summary.
std::string export_checkpoint_to_hf(const std::string& ckpt_dir, const std::string& out_dir);

}  // namespace slimpi
