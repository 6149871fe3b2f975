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

// DeepSeekMoE routing (GLM-4.5, DeepSeek-V3) on a model with experts: sigmoid router with
// a correction bias, n_group groups of which a token uses topk_group, weights x 2.5, one
// shared expert; the first first_k_dense layers dense.
inline void use_deepseek_moe(ModelConfig& c, int64_t n_group, int64_t topk_group, int64_t first_k_dense) {
  c.moe_router = "sigmoid";
  c.moe_router_bias = true;
  c.moe_n_group = n_group;
  c.moe_topk_group = topk_group;
  c.moe_routed_scaling_factor = 2.5;
  c.n_shared_experts = 1;
  c.first_k_dense_replace = first_k_dense;
}

// DeepSeek-V3's multi-head latent attention at a test's scale: a query latent of 12,
// a key/value latent of 16, per head 8 no-rope + 4 rotary dims (interleaved pairs) and 6
// value dims; no biases or q/k norms (MLA has none).
inline void use_latent_attention(ModelConfig& c) {
  c.qkv_bias = c.o_bias = c.qk_norm = false;
  c.partial_rotary_factor = 1.0;
  c.kv_lora_rank = 16;
  c.q_lora_rank = 12;
  c.qk_nope_head_dim = 8;
  c.qk_rope_head_dim = 4;
  c.v_head_dim = 6;
  c.rope_interleave = true;
  c.n_kv_heads = c.n_heads;
}

// Qwen3.5's shape: layers 0-2 of 4 Gated DeltaNet (2 key heads of 8 shared by 4 value
// heads of 8, a 4-tap convolution), layer 3 gated full attention with q/k norms rotating a
// quarter of each head, zero-centred RMSNorms.
inline void use_gated_delta_net(ModelConfig& c) {
  c.n_layers = 4;
  c.full_attention_interval = 4;
  c.linear_num_key_heads = 2;
  c.linear_num_value_heads = 4;
  c.linear_key_head_dim = 8;
  c.linear_value_head_dim = 8;
  c.linear_conv_kernel_dim = 4;
  c.attn_output_gate = true;
  c.zero_centered_norm = true;
  c.qk_norm = true;
  c.explicit_head_dim = 8;
  c.partial_rotary_factor = 0.25;
}

}  // namespace slimpi::testing
