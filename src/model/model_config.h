// ModelConfig — the shape of the policy transformer (deck table [model]).
// Llama/Qwen2 family: H query heads of size D = hidden_size / H, n_kv_heads ≤ H
// key/value heads (grouped-query attention, H % n_kv_heads == 0), SwiGLU MLP of width
// intermediate_size, RoPE with rope_theta, RMSNorm with rms_norm_eps.
#pragma once

#include <cstdint>
#include <string>

namespace slimpi {

class Deck;

struct ModelConfig {
  int64_t vocab_size = 260;
  int64_t hidden_size = 128;
  int64_t n_layers = 4;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 4;
  int64_t intermediate_size = 344;
  int64_t max_seq_len = 512;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  double init_std = 0.02;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;

  int64_t head_dim() const { return hidden_size / n_heads; }
  // Parameters of the model (embeddings and head included).
  int64_t n_params() const;
  // Multiply-adds per token of the dense layers (2 x this = forward FLOPs per token,
  // attention scores excluded): what MFU is measured against.
  int64_t matmul_params() const;

  // Reads [model] and checks the cross-key rules (heads divide hidden size and each
  // other); a violation is a collective error naming the keys.
  static ModelConfig from_deck(const Deck& deck);
};

}  // namespace slimpi
