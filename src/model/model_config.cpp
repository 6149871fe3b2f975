#include "model/model_config.h"

#include <slimpi/deck.h>
#include <slimpi/error.h>

namespace slimpi {

int64_t ModelConfig::matmul_params() const {
  const int64_t d = hidden_size, kv = n_kv_heads * head_dim();
  const int64_t attention = d * d + 2 * d * kv + d * d;  // q, k, v, o
  const int64_t mlp = 3 * d * intermediate_size;          // gate, up, down
  return n_layers * (attention + mlp) + vocab_size * d;  // + LM head
}

int64_t ModelConfig::n_params() const {
  const int64_t d = hidden_size, kv = n_kv_heads * head_dim();
  const int64_t per_layer = d * d + 2 * d * kv + d * d + 3 * d * intermediate_size + 2 * d +
                            (qkv_bias ? d + 2 * kv : 0);
  return vocab_size * d * (tie_word_embeddings ? 1 : 2) + n_layers * per_layer + d;
}

ModelConfig ModelConfig::from_deck(const Deck& deck) {
  ModelConfig c;
  c.vocab_size = deck.get_int("model.vocab_size");
  c.hidden_size = deck.get_int("model.hidden_size");
  c.n_layers = deck.get_int("model.n_layers");
  c.n_heads = deck.get_int("model.n_heads");
  c.n_kv_heads = deck.get_int("model.n_kv_heads");
  if (c.n_kv_heads == 0) c.n_kv_heads = c.n_heads;
  c.intermediate_size = deck.get_int("model.intermediate_size");
  c.max_seq_len = deck.get_int("model.max_seq_len");
  c.rope_theta = deck.get_float("model.rope_theta");
  c.rms_norm_eps = deck.get_float("model.rms_norm_eps");
  c.init_std = deck.get_float("model.init_std");
  c.tie_word_embeddings = deck.get_bool("model.tie_word_embeddings");
  c.qkv_bias = deck.get_bool("model.qkv_bias");
  if (c.hidden_size % c.n_heads != 0)
    SLIMPI_FAIL_ALL("model.hidden_size = {} must be a multiple of model.n_heads = {}", c.hidden_size, c.n_heads);
  if (c.head_dim() % 2 != 0)
    SLIMPI_FAIL_ALL("model.hidden_size / model.n_heads = {} must be even (RoPE rotates pairs)", c.head_dim());
  if (c.n_heads % c.n_kv_heads != 0)
    SLIMPI_FAIL_ALL("model.n_heads = {} must be a multiple of model.n_kv_heads = {}", c.n_heads, c.n_kv_heads);
  return c;
}

}  // namespace slimpi
