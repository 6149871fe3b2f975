// Deck keys of the policy model:
// declared beside the code that reads them, collected by deck_keys() (cli/deck_keys.cpp).
#include "deck/key_tables.h"

namespace slimpi {

std::vector<KeySpec> model_keys() {
  return {
      // [model]
      int_key("model.vocab_size", 260, 2, 1e7, "tokens", "vocabulary size (the byte tokenizer needs 259)"),
      int_key("model.hidden_size", 128, 2, 1e6, "", "model width d"),
      int_key("model.n_layers", 4, 1, 1e4, "", "transformer blocks L"),
      int_key("model.n_heads", 4, 1, 1e4, "", "query heads H (hidden_size / n_heads = head dim D unless model.head_dim)"),
      int_key("model.n_kv_heads", 0, 0, 1e4, "", "key/value heads (grouped-query attention; 0 = n_heads)"),
      int_key("model.intermediate_size", 344, 1, 1e7, "", "SwiGLU MLP width"),
      int_key("model.max_seq_len", 512, 2, 1e7, "tokens", "longest prompt + response the model accepts"),
      float_key("model.rope_theta", 10000.0, 1.0, 1e12, "", "RoPE base"),
      float_key("model.rms_norm_eps", 1e-6, 0.0, 1.0, "", "RMSNorm epsilon"),
      float_key("model.init_std", 0.02, 0.0, 10.0, "", "std of the normal initialisation of weights"),
      bool_key("model.tie_word_embeddings", false, "LM head shares the embedding matrix"),
      bool_key("model.qkv_bias", false, "biases on the q/k/v projections (Qwen2; Llama/Qwen3 attention_bias)"),
      bool_key("model.o_bias", false, "bias on the o projection (Llama/Qwen3 attention_bias)"),
      bool_key("model.qk_norm", false, "RMSNorm of each query and key head before RoPE (Qwen3's q_norm/k_norm)"),
      int_key("model.n_experts", 0, 0, 32767, "experts",
              "mixture of experts: routed experts per MoE layer (0 = dense; Qwen3-MoE's num_experts)"),
      int_key("model.n_experts_per_tok", 2, 1, 1e5, "experts", "MoE: experts each token is routed to (top-k)"),
      int_key("model.moe_intermediate_size", 0, 0, 1e9, "", "MoE: each expert's MLP width (0 = intermediate_size)"),
      bool_key("model.norm_topk_prob", true, "MoE: renormalise the top-k router probabilities to sum to 1"),
      int_key("model.shared_expert_intermediate_size", 0, 0, 1e9, "",
              "MoE: width of a shared expert every token runs, behind a sigmoid gate (Qwen2-MoE; 0 = none)"),
      choice_key("model.moe_router", "softmax", {"softmax", "sigmoid"},
                 "MoE router scores: softmax over the experts (Qwen, Mixtral) or each expert's sigmoid "
                 "(DeepSeekMoE: DeepSeek-V3, GLM-4.5; scoring_func)"),
      bool_key("model.moe_router_bias", false,
               "MoE, sigmoid router: a per-expert score correction bias (e_score_correction_bias) added only to "
               "choose experts; loaded, checkpointed, synced and exported, never trained"),
      int_key("model.moe_n_group", 1, 1, 1024, "groups",
              "MoE, sigmoid router: expert groups (n_group); a token uses the moe_topk_group groups whose top-2 "
              "scores sum highest"),
      int_key("model.moe_topk_group", 1, 1, 1024, "groups", "MoE, sigmoid router: groups a token may use (topk_group)"),
      float_key("model.moe_routed_scaling_factor", 1.0, 1e-6, 1e6, "",
                "MoE: the routed experts' weights times this (routed_scaling_factor)"),
      int_key("model.n_shared_experts", 0, 0, 1024, "experts",
              "MoE: DeepSeekMoE's ungated shared experts every token runs, as one MLP of n_shared_experts x "
              "moe_intermediate_size (0 = none)"),
      int_key("model.first_k_dense_replace", 0, 0, 1e6, "layers", "MoE: the first k layers keep the dense MLP"),
      float_key("model.partial_rotary_factor", 1.0, 1e-6, 1.0, "",
                "RoPE rotates the first head_dim x factor dimensions of each head (GLM-4.5: 0.5)"),
      int_key("model.kv_lora_rank", 0, 0, 1e5, "",
              "multi-head latent attention (DeepSeek-V3, GLM-4.7-Flash): the key/value latent's width per token "
              "(0 = ordinary attention)"),
      int_key("model.q_lora_rank", 0, 0, 1e5, "",
              "MLA: the query latent's width (0 = q_proj straight from the hidden state)"),
      int_key("model.qk_nope_head_dim", 0, 0, 1e5, "", "MLA: the query/key dimensions of each head without RoPE"),
      int_key("model.qk_rope_head_dim", 0, 0, 1e5, "",
              "MLA: the rotary query/key dimensions (the key's shared by every head)"),
      int_key("model.v_head_dim", 0, 0, 1e5, "", "MLA: each head's value dimension"),
      bool_key("model.rope_interleave", false,
               "MLA: the rotary dimensions rotate as interleaved pairs (DeepSeek's layout)"),
      int_key("model.mtp_num_layers", 0, 0, 16, "layers",
              "multi-token prediction depths (DeepSeek-V3's MTP modules, as MiMo ships them): depth i predicts the "
              "token i + 2 ahead; the rollout's speculative draft (rollout.speculative = \"mtp\"); 0 = none"),
      int_key("model.full_attention_interval", 1, 1, 1e6, "layers",
              "hybrid linear attention (Qwen3.5, Qwen3-Next): layer l (from 0) is full attention when (l + 1) % "
              "interval == 0, every other layer Gated DeltaNet linear attention (1 = every layer full attention)"),
      int_key("model.linear_num_key_heads", 0, 0, 1e5, "", "Gated DeltaNet: query/key heads"),
      int_key("model.linear_num_value_heads", 0, 0, 1e5, "",
              "Gated DeltaNet: value heads (a multiple of the key heads, which they share)"),
      int_key("model.linear_key_head_dim", 0, 0, 1e5, "", "Gated DeltaNet: each query/key head's dimension"),
      int_key("model.linear_value_head_dim", 0, 0, 1e5, "", "Gated DeltaNet: each value head's dimension"),
      int_key("model.linear_conv_kernel_dim", 4, 2, 64, "taps",
              "Gated DeltaNet: the causal depthwise convolution over q/k/v"),
      bool_key("model.linear_fused_projections", false,
               "Gated DeltaNet: the projections fused per key head, as Qwen3-Next ships them (in_proj_qkvz, "
               "in_proj_ba); Qwen3.5's in_proj_qkv / _z / _b / _a otherwise"),
      bool_key("model.attn_output_gate", false,
               "gated attention (Qwen3-Next, Qwen3.5): q_proj also yields a per-head output gate, the attention "
               "output times its sigmoid"),
      bool_key("model.zero_centered_norm", false,
               "RMSNorm weights stored as w and applied as 1 + w (Qwen3-Next, Qwen3.5)"),
      int_key("model.moe_layer_freq", 1, 1, 1e6, "layers",
              "MoE: layer l (from 0) is sparse when (l + 1) % moe_layer_freq == 0 (Qwen3-MoE's decoder_sparse_step)"),
      int_key("model.head_dim", 0, 0, 1e5, "", "head dimension D (0 = hidden_size / n_heads; Qwen3 sets it)"),
      choice_key("model.rope_scaling", "none", {"none", "linear", "llama3", "yarn"},
                 "RoPE frequency scaling (Hugging Face rope_scaling): linear = every frequency / rope_factor; "
                 "llama3 = Llama 3.1's blend by wavelength; yarn = YaRN (DeepSeek-V3, Qwen3 long context)"),
      float_key("model.rope_beta_fast", 32.0, 1e-6, 1e6, "", "yarn rope_scaling: beta_fast"),
      float_key("model.rope_beta_slow", 1.0, 1e-6, 1e6, "", "yarn rope_scaling: beta_slow"),
      float_key("model.rope_mscale", 0.0, 0.0, 1e6, "", "yarn rope_scaling: mscale (0 = not given)"),
      float_key("model.rope_mscale_all_dim", 0.0, 0.0, 1e6, "",
                "rope_scaling's mscale_all_dim (0 = not given; yarn's attention factor uses it, and latent "
                "attention's softmax scale grows by its mscale squared under any rope_scaling)"),
      float_key("model.rope_attention_factor", 0.0, 0.0, 1e6, "",
                "yarn rope_scaling: attention_factor on cos and sin (0 = derived from factor and the mscales)"),
      bool_key("model.rope_truncate", true, "yarn rope_scaling: truncate the correction range to whole dimensions"),
      float_key("model.rope_factor", 1.0, 1e-6, 1e6, "", "rope_scaling factor"),
      float_key("model.rope_low_freq_factor", 1.0, 1e-6, 1e6, "", "llama3 rope_scaling: low_freq_factor"),
      float_key("model.rope_high_freq_factor", 4.0, 1e-6, 1e6, "", "llama3 rope_scaling: high_freq_factor"),
      int_key("model.rope_original_max_seq_len", 8192, 1, 1e9, "tokens",
              "llama3 and yarn rope_scaling: original_max_position_embeddings"),
      string_key("model.init_from", "",
                 "start from these weights instead of the seeded init: a trainer_state.h5 (group /model), "
                 "a checkpoint's trainer_state.h5, or a Hugging Face export (directory or .safetensors)")
  };
}

}  // namespace slimpi
