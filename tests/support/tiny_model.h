// The small policy shape the tests share: byte vocabulary, d 32, 2 layers, 4 query
// heads over 2 KV heads (grouped-query), SwiGLU 64. Callers choose the context length
// and the init scale (larger than usual makes random models' samples varied).
#pragma once

#include "model/model_config.h"

namespace slimpi::testing {

inline ModelConfig tiny_model_config(int64_t max_seq_len, double init_std) {
  ModelConfig c;
  c.vocab_size = 260;
  c.hidden_size = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.intermediate_size = 64;
  c.max_seq_len = max_seq_len;
  c.init_std = init_std;
  return c;
}

}  // namespace slimpi::testing
