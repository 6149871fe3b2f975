// ModelConfig — the shape of the policy transformer (deck table [model]).
// Llama / Qwen2 / Qwen3 family: H query heads of size D (hidden_size / H, or an explicit
// head_dim as Qwen3 has), n_kv_heads ≤ H key/value heads (grouped-query attention,
// H % n_kv_heads == 0), SwiGLU MLP of width intermediate_size, RMSNorm with
// rms_norm_eps, RoPE with rope_theta and an optional frequency scaling (linear, or
// Llama 3's), optional biases on q/k/v (Qwen2) and o (Llama/Qwen3 attention_bias),
// optional RMSNorm of each query/key head before RoPE (Qwen3's q_norm/k_norm).
// With model.init_from naming a Hugging Face directory, the deck's [model] keys come
// from its config.json (config/hf_config.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slimpi {

class Deck;

struct ModelConfig {
  int64_t vocab_size = 260;
  int64_t hidden_size = 128;
  int64_t n_layers = 4;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 4;
  int64_t explicit_head_dim = 0;  // 0: hidden_size / n_heads
  int64_t intermediate_size = 344;
  int64_t max_seq_len = 512;
  double rope_theta = 10000.0;
  // RoPE frequency scaling (Hugging Face's rope_scaling): "none", "linear" (every
  // frequency / factor) or "llama3" (long wavelengths / factor, short ones kept, a
  // smooth blend between, by original_max_seq_len / low_freq_factor and / high_freq_factor).
  std::string rope_scaling = "none";
  double rope_factor = 1.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_seq_len = 8192;
  // YaRN (rope_scaling "yarn", transformers' _compute_yarn_parameters): frequencies blend
  // from extrapolated (fast dims) to interpolated by rope_factor (slow dims) over the
  // correction range of beta_fast / beta_slow rotations at original_max_seq_len (floored /
  // ceiled when truncate); cos and sin times the attention factor (given, or
  // m(factor, mscale) / m(factor, mscale_all_dim) with both, or m(factor), where
  // m(s, k) = 0.1 k ln s + 1); multi-head latent attention also multiplies its softmax
  // scale by m(factor, mscale_all_dim)² (DeepSeek-V3).
  double rope_beta_fast = 32.0, rope_beta_slow = 1.0;
  double rope_mscale = 0.0, rope_mscale_all_dim = 0.0;  // 0: not given
  double rope_attention_factor = 0.0;                   // 0: derived
  bool rope_truncate = true;
  double rms_norm_eps = 1e-6;
  double init_std = 0.02;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;
  bool o_bias = false;
  bool qk_norm = false;
  // Mixture of experts (Qwen3-MoE, Qwen2-MoE): sparse layers route each token to
  // n_experts_per_tok of n_experts SwiGLU experts of width moe_intermediate_size (softmax
  // router, top-k, renormalised when norm_topk_prob), plus, with
  // shared_expert_intermediate_size > 0, a shared expert behind a sigmoid gate; the other
  // layers keep the dense MLP.
  int64_t n_experts = 0;  // 0: every layer dense
  int64_t n_experts_per_tok = 2;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = true;
  int64_t moe_layer_freq = 1;
  int64_t shared_expert_intermediate_size = 0;  // Qwen2-MoE's gated shared expert (0: none)
  // DeepSeekMoE (DeepSeek-V3, GLM-4.5; model/moe.h): sigmoid router scores, a score
  // correction bias for choosing experts only, group-limited top-k, the weights times
  // routed_scaling_factor, n_shared_experts ungated shared experts of
  // moe_intermediate_size each (run as one MLP), and the first first_k_dense_replace
  // layers dense.
  std::string moe_router = "softmax";  // "softmax" or "sigmoid"
  bool moe_router_bias = false;        // e_score_correction_bias (sigmoid only)
  int64_t moe_n_group = 1, moe_topk_group = 1;
  double moe_routed_scaling_factor = 1.0;
  int64_t n_shared_experts = 0;
  int64_t first_k_dense_replace = 0;
  // RoPE rotates the first rotary_dim() dimensions of each head (GLM-4.5: half of them).
  double partial_rotary_factor = 1.0;
  // Multi-head latent attention (DeepSeek-V3, GLM-4.7-Flash; kv_lora_rank > 0): queries
  // through q_a_proj → q_a_layernorm → q_b_proj (q_proj when q_lora_rank = 0); keys and
  // values from a latent c of kv_lora_rank values per token (kv_a_proj_with_mqa →
  // kv_a_layernorm → kv_b_proj) and one shared rotary key of qk_rope_head_dim; per head
  // qk_nope_head_dim + qk_rope_head_dim for queries and keys, v_head_dim for values.
  int64_t kv_lora_rank = 0;  // 0: not MLA
  int64_t q_lora_rank = 0;   // 0: q_proj
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool rope_interleave = false;  // the rotary dims in interleaved pairs (DeepSeek's layout)
  // Multi-token prediction (DeepSeek-V3's MTP modules, as MiMo ships them): depth i of
  // mtp_num_layers predicts the token i + 2 places ahead from the previous depth's
  // output and the embedding of the token i + 1 ahead (model/transformer.h). 0: none.
  int64_t mtp_num_layers = 0;
  // Hybrid linear attention (Qwen3.5, Qwen3-Next; model/gated_delta_net.h): layer l is full
  // attention when (l + 1) % full_attention_interval == 0, else a Gated DeltaNet layer of
  // linear_num_key_heads key heads of linear_key_head_dim (shared by
  // linear_num_value_heads / linear_num_key_heads value heads each) and
  // linear_num_value_heads value heads of linear_value_head_dim, its q/k/v through a causal
  // depthwise convolution of linear_conv_kernel_dim taps. 1: every layer full attention.
  int64_t full_attention_interval = 1;
  int64_t linear_num_key_heads = 0, linear_num_value_heads = 0;
  int64_t linear_key_head_dim = 0, linear_value_head_dim = 0;
  int64_t linear_conv_kernel_dim = 4;
  // Qwen3-Next's layout of the projections: in_proj_qkvz [Hk·(2·Dk + 2·(Hv/Hk)·Dv), d], per
  // key head its query, key, values and z rows, and in_proj_ba [2·Hv, d], per key head its
  // b then a rows; Qwen3.5's four separate ones otherwise.
  bool linear_fused_projections = false;
  // Qwen3-Next's gated attention: q_proj yields each head's query and an output gate
  // (per head [query; gate]), the attention output times sigmoid(gate) before o_proj.
  bool attn_output_gate = false;
  // Zero-centred RMSNorm (Qwen3-Next, Qwen3.5; Gemma's): every RMSNorm weight w of the
  // blocks, the final norm and the q/k norms is stored as w and applied as 1 + w.
  bool zero_centered_norm = false;

  bool is_hybrid() const { return full_attention_interval > 1; }
  bool is_linear_layer(int64_t layer) const { return is_hybrid() && (layer + 1) % full_attention_interval != 0; }
  int64_t n_linear_layers() const;
  int64_t linear_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int64_t linear_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  // The convolved channels: each key head's query and key and its value heads' values
  // (slimpi's order, grouped by key head: model/linear_channels.h).
  int64_t linear_conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }
  // One sequence's state over every linear layer, in values (KvCache::conv_state and
  // delta_state: the convolution's last K - 1 inputs, the [Hv, Dk, Dv] recurrent state).
  int64_t linear_state_size() const {
    return n_linear_layers() * (linear_conv_dim() * (linear_conv_kernel_dim - 1) +
                                linear_num_value_heads * linear_key_head_dim * linear_value_head_dim);
  }
  bool is_mla() const { return kv_lora_rank > 0; }
  // The query/key head dimension (MLA: qk_nope_head_dim + qk_rope_head_dim).
  int64_t head_dim() const {
    if (is_mla()) return qk_nope_head_dim + qk_rope_head_dim;
    return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / n_heads;
  }
  // The value head dimension (MLA: v_head_dim; else head_dim()).
  int64_t value_head_dim() const { return is_mla() ? v_head_dim : head_dim(); }
  // transformers' int(head_dim · partial_rotary_factor) (MLA: qk_rope_head_dim).
  int64_t rotary_dim() const {
    return is_mla() ? qk_rope_head_dim : int64_t(double(head_dim()) * partial_rotary_factor);
  }
  bool is_moe_layer(int64_t layer) const {
    return n_experts > 0 && layer >= first_k_dense_replace && (layer + 1) % moe_layer_freq == 0;
  }
  // Whether the model uses anything of DeepSeekMoE or partial RoPE (the families that
  // export such a model are arch/architecture.h's deepseek_moe ones).
  bool uses_deepseek_features() const {
    return partial_rotary_factor != 1.0 || is_mla() || (n_experts > 0 && (moe_router != "softmax" || moe_router_bias ||
                                                              moe_n_group > 1 || moe_routed_scaling_factor != 1.0 ||
                                                              n_shared_experts > 0 || first_k_dense_replace > 0));
  }
  // Whether each MTP depth's block is an MoE layer: a DeepSeekMoE model's is, as
  // DeepSeek-V3's and GLM-4.5's are, and a hybrid MoE model's whose every layer is sparse
  // (Qwen3.5-MoE's, Qwen3-Next's: their readers take the depth's MLP as layer 0's); the
  // other families' MTP depths are dense.
  bool mtp_is_moe() const {
    return n_experts > 0 && (moe_router == "sigmoid" || (is_hybrid() && moe_layer_freq == 1));
  }
  // The shared experts' MLP width (DeepSeekMoE's n_shared_experts · moe_intermediate_size; 0: none).
  int64_t shared_experts_width() const { return n_shared_experts * moe_intermediate_size; }
  int64_t n_moe_layers() const;
  // RoPE inverse frequencies, scaling applied: theta^(-2i/R) for i < R/2, R = rotary_dim().
  std::vector<double> rope_inv_freq() const;
  // What cos and sin are multiplied by (1 but for YaRN).
  double rope_cos_sin_factor() const;
  // What the attention softmax scale 1/√D is multiplied by: 1 but for latent attention
  // under a rope_scaling with mscale_all_dim (yarn_mscale(factor, mscale_all_dim)², as
  // transformers' yarn_apply_mscale for every rope type but the default).
  double softmax_scale_factor() const;
  // Parameters of the model (embeddings, head and MTP layers included).
  int64_t n_params() const;
  // Parameters of one MTP depth (its norms, input projection and transformer layer).
  int64_t n_mtp_params_per_layer() const;
  // Multiply-adds per token of the dense layers (2 x this = forward FLOPs per token,
  // attention scores excluded; MoE layers: the router and the top-k experts a token
  // runs): what MFU is measured against.
  int64_t matmul_params() const;

  // Reads [model] and checks the cross-key rules (heads divide hidden size and each
  // other); a violation is a collective error naming the keys.
  static ModelConfig from_deck(const Deck& deck);
};

}  // namespace slimpi
