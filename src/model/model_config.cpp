#include "model/model_config.h"

#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace slimpi {

std::vector<double> ModelConfig::rope_inv_freq() const {
  const int64_t D = rotary_dim();
  std::vector<double> f;
  for (int64_t i = 0; i < D / 2; ++i) f.push_back(std::pow(rope_theta, -2.0 * double(i) / double(D)));
  if (rope_scaling == "yarn") {
    // Dimension pair i rotates θ^(-2i/D) per position; the pairs that complete more than
    // beta_fast rotations over the original context keep it, those under beta_slow are
    // interpolated (/ factor), with a linear ramp between (transformers' formula).
    const double pi = std::acos(-1.0), base = rope_theta, Dd = double(D);
    auto correction_dim = [&](double rotations) {
      return Dd * std::log(double(rope_original_max_seq_len) / (rotations * 2 * pi)) / (2 * std::log(base));
    };
    double low = correction_dim(rope_beta_fast), high = correction_dim(rope_beta_slow);
    if (rope_truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, Dd - 1);
    if (low == high) high += 0.001;
    for (size_t i = 0; i < f.size(); ++i) {
      const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
      const double extrapolated = 1 - ramp;  // the share of the original frequency
      f[i] = f[i] / rope_factor * (1 - extrapolated) + f[i] * extrapolated;
    }
  } else if (rope_scaling == "linear") {
    for (double& x : f) x /= rope_factor;
  } else if (rope_scaling == "llama3") {
    // Hugging Face's _compute_llama3_parameters: wavelength λ = 2π / f; λ above
    // old / low_freq_factor → f / factor; below old / high_freq_factor → f kept; between,
    // s = (old / λ - low) / (high - low), f = (1 - s) f / factor + s f.
    const double old = double(rope_original_max_seq_len), pi = std::acos(-1.0);
    const double low_wavelen = old / rope_low_freq_factor, high_wavelen = old / rope_high_freq_factor;
    for (double& x : f) {
      const double wavelen = 2 * pi / x;
      if (wavelen > low_wavelen) {
        x /= rope_factor;
      } else if (wavelen >= high_wavelen) {
        const double s = (old / wavelen - rope_low_freq_factor) / (rope_high_freq_factor - rope_low_freq_factor);
        x = (1 - s) * x / rope_factor + s * x;
      }
    }
  }
  return f;
}

namespace {

double yarn_mscale(double scale, double k) { return scale <= 1 ? 1.0 : 0.1 * k * std::log(scale) + 1.0; }

}  // namespace

double ModelConfig::rope_cos_sin_factor() const {
  if (rope_scaling != "yarn") return 1.0;
  if (rope_attention_factor > 0) return rope_attention_factor;
  if (rope_mscale > 0 && rope_mscale_all_dim > 0)
    return yarn_mscale(rope_factor, rope_mscale) / yarn_mscale(rope_factor, rope_mscale_all_dim);
  return yarn_mscale(rope_factor, 1.0);
}

double ModelConfig::softmax_scale_factor() const {
  if (rope_scaling == "none" || !is_mla() || rope_mscale_all_dim <= 0) return 1.0;
  const double m = yarn_mscale(rope_factor, rope_mscale_all_dim);
  return m * m;
}

int64_t ModelConfig::n_moe_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < n_layers; ++l) n += is_moe_layer(l);
  return n;
}

namespace {

// The attention block's matrices: q, k, v, o (MLA: its projections).
int64_t attention_matrices(const ModelConfig& c) {
  const int64_t d = c.hidden_size, H = c.n_heads;
  const int64_t q_rows = H * c.head_dim() * (c.attn_output_gate ? 2 : 1);  // (gated: each head's query and gate)
  if (!c.is_mla()) return d * q_rows + 2 * d * c.n_kv_heads * c.head_dim() + H * c.head_dim() * d;
  const int64_t q = c.q_lora_rank > 0 ? d * c.q_lora_rank + c.q_lora_rank * H * c.head_dim() : d * H * c.head_dim();
  return q + d * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank * H * (c.qk_nope_head_dim + c.v_head_dim) +
         H * c.v_head_dim * d;
}

}  // namespace

int64_t ModelConfig::n_linear_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < n_layers; ++l) n += is_linear_layer(l) ? 1 : 0;
  return n;
}

namespace {

// A Gated DeltaNet layer's matrices: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj.
int64_t linear_attention_matrices(const ModelConfig& c) {
  const int64_t d = c.hidden_size;
  return d * c.linear_conv_dim() + 2 * d * c.linear_value_dim() + 2 * d * c.linear_num_value_heads;
}

// Its other parameters: the convolution's taps, dt_bias, A_log, the gated norm.
int64_t linear_attention_vectors(const ModelConfig& c) {
  return c.linear_conv_dim() * c.linear_conv_kernel_dim + 2 * c.linear_num_value_heads + c.linear_value_head_dim;
}

}  // namespace

int64_t ModelConfig::matmul_params() const {
  const int64_t d = hidden_size;
  const int64_t n_linear = n_linear_layers();
  const int64_t attention = attention_matrices(*this);
  const int64_t mlp = 3 * d * intermediate_size;        // gate, up, down
  const int64_t shared = (shared_expert_intermediate_size > 0 ? 3 * d * shared_expert_intermediate_size + d : 0) +
                         3 * d * shared_experts_width();
  const int64_t moe = d * n_experts + n_experts_per_tok * 3 * d * moe_intermediate_size + shared;  // router, top-k, shared
  const int64_t n_moe = n_moe_layers();
  return (n_layers - n_linear) * attention + n_linear * linear_attention_matrices(*this) + (n_layers - n_moe) * mlp +
         n_moe * moe + vocab_size * d;  // + LM head
}

namespace {

// An attention block and its two norms.
int64_t attention_params(const ModelConfig& c) {
  const int64_t d = c.hidden_size, q = c.n_heads * c.head_dim(), kv = c.n_kv_heads * c.head_dim();
  if (c.is_mla()) return attention_matrices(c) + 2 * d + c.q_lora_rank + c.kv_lora_rank;  // + the latents' norms
  return attention_matrices(c) + 2 * d + (c.qkv_bias ? q * (c.attn_output_gate ? 2 : 1) + 2 * kv : 0) + (c.o_bias ? d : 0) +
         (c.qk_norm ? 2 * c.head_dim() : 0);
}

// One MoE layer's MLP: router (and correction bias), experts, shared expert(s).
int64_t moe_params(const ModelConfig& c) {
  const int64_t d = c.hidden_size;
  return d * c.n_experts + c.n_experts * 3 * d * c.moe_intermediate_size +
         (c.shared_expert_intermediate_size > 0 ? 3 * d * c.shared_expert_intermediate_size + d : 0) +
         3 * d * c.shared_experts_width() + (c.moe_router_bias ? c.n_experts : 0);
}

}  // namespace

int64_t ModelConfig::n_mtp_params_per_layer() const {
  const int64_t d = hidden_size;
  // token and hidden norms, input projection [d, 2d], a dense (or MoE) layer, its final norm
  const int64_t mlp = mtp_is_moe() ? moe_params(*this) : 3 * d * intermediate_size;
  return 2 * d + 2 * d * d + attention_params(*this) + mlp + d;
}

int64_t ModelConfig::n_params() const {
  const int64_t d = hidden_size;
  const int64_t n_moe = n_moe_layers();
  const int64_t mlps = (n_layers - n_moe) * 3 * d * intermediate_size + n_moe * moe_params(*this);
  const int64_t n_linear = n_linear_layers();
  const int64_t token_mixers = (n_layers - n_linear) * attention_params(*this) +
                               n_linear * (linear_attention_matrices(*this) + linear_attention_vectors(*this) + 2 * d);
  return vocab_size * d * (tie_word_embeddings ? 1 : 2) + token_mixers + mlps + d +
         mtp_num_layers * n_mtp_params_per_layer();
}

namespace {

// The Gated DeltaNet keys: heads and dimensions given, value heads a multiple of key heads.
void check_linear_attention(const ModelConfig& c, const Deck& deck) {
  if (!c.is_hybrid()) {
    for (const char* k : {"model.attn_output_gate", "model.zero_centered_norm", "model.linear_fused_projections"})
      if (deck.get_bool(k))
        SLIMPI_FAIL_ALL("{} = true ({}) is Qwen3.5's and Qwen3-Next's, which go with Gated DeltaNet layers: set "
                        "model.full_attention_interval > 1 ({}) or drop the key (no other family has it)",
                        k, deck.source(k), deck.source("model.full_attention_interval"));
    return;
  }
  const char* keys[] = {"model.linear_num_key_heads", "model.linear_num_value_heads", "model.linear_key_head_dim",
                        "model.linear_value_head_dim"};
  for (const char* k : keys)
    if (deck.get_int(k) <= 0)
      SLIMPI_FAIL_ALL("model.full_attention_interval = {} ({}) makes Gated DeltaNet layers, which need {} > 0 ({})",
                      c.full_attention_interval, deck.source("model.full_attention_interval"), k, deck.source(k));
  if (c.full_attention_interval > c.n_layers)
    SLIMPI_FAIL_ALL("model.full_attention_interval = {} ({}) leaves none of the {} layers full attention (Qwen3.5 and "
                    "Qwen3-Next have some; a model of linear layers alone is not supported)",
                    c.full_attention_interval, deck.source("model.full_attention_interval"), c.n_layers);
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
    SLIMPI_FAIL_ALL("model.linear_num_value_heads = {} ({}) must be a multiple of model.linear_num_key_heads = {} ({})",
                    c.linear_num_value_heads, deck.source("model.linear_num_value_heads"), c.linear_num_key_heads,
                    deck.source("model.linear_num_key_heads"));
  if (c.is_mla())
    SLIMPI_FAIL_ALL("model.full_attention_interval = {} ({}) with multi-head latent attention (model.kv_lora_rank = "
                    "{}): no model has both", c.full_attention_interval, deck.source("model.full_attention_interval"),
                    c.kv_lora_rank);
}

// The DeepSeekMoE keys against each other and the expert count.
void check_deepseek_moe(const ModelConfig& c, const Deck& deck) {
  auto key = [&](const char* k) { return fmt::format("{} ({})", k, deck.source(k)); };
  const bool sigmoid = c.moe_router == "sigmoid";
  if (c.moe_router_bias && !sigmoid)
    SLIMPI_FAIL_ALL("{} = true needs model.moe_router = \"sigmoid\" (the correction bias is DeepSeekMoE's)",
                    key("model.moe_router_bias"));
  if (c.n_shared_experts > 0 && c.shared_expert_intermediate_size > 0)
    SLIMPI_FAIL_ALL("{} = {} and {} = {}: a model has DeepSeekMoE's ungated shared experts or Qwen2-MoE's gated "
                    "one, not both", key("model.n_shared_experts"), c.n_shared_experts,
                    key("model.shared_expert_intermediate_size"), c.shared_expert_intermediate_size);
  if (c.n_experts == 0) return;
  if (c.moe_n_group > 1 && !sigmoid)
    SLIMPI_FAIL_ALL("{} = {} (group-limited routing) needs model.moe_router = \"sigmoid\"", key("model.moe_n_group"),
                    c.moe_n_group);
  if (c.n_experts % c.moe_n_group != 0 || (c.moe_n_group > 1 && c.n_experts / c.moe_n_group < 2))
    SLIMPI_FAIL_ALL("{} = {} must divide model.n_experts = {} into groups of at least 2 experts (a group scores "
                    "as the sum of its top 2)", key("model.moe_n_group"), c.moe_n_group, c.n_experts);
  if (c.moe_topk_group > c.moe_n_group)
    SLIMPI_FAIL_ALL("{} = {} exceeds {} = {}", key("model.moe_topk_group"), c.moe_topk_group,
                    key("model.moe_n_group"), c.moe_n_group);
  if (c.n_experts_per_tok > c.moe_topk_group * (c.n_experts / c.moe_n_group))
    SLIMPI_FAIL_ALL("{} = {} exceeds the {} experts of the model.moe_topk_group = {} groups a token may use",
                    key("model.n_experts_per_tok"), c.n_experts_per_tok,
                    c.moe_topk_group * (c.n_experts / c.moe_n_group), c.moe_topk_group);
}

// Multi-head latent attention's keys: its dimensions, and what it does not combine with.
void check_mla(const ModelConfig& c, const Deck& deck) {
  if (!c.is_mla()) {
    if (c.q_lora_rank > 0 || c.rope_interleave)
      SLIMPI_FAIL_ALL("model.q_lora_rank ({}) and model.rope_interleave ({}) are multi-head latent attention's: they "
                      "need model.kv_lora_rank > 0", deck.source("model.q_lora_rank"),
                      deck.source("model.rope_interleave"));
    return;
  }
  if (c.qk_nope_head_dim <= 0 || c.qk_rope_head_dim <= 0 || c.qk_rope_head_dim % 2 != 0 || c.v_head_dim <= 0)
    SLIMPI_FAIL_ALL("model.kv_lora_rank = {} ({}): multi-head latent attention needs model.qk_nope_head_dim > 0, an "
                    "even model.qk_rope_head_dim > 0 and model.v_head_dim > 0 (now {}, {}, {})", c.kv_lora_rank,
                    deck.source("model.kv_lora_rank"), c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim);
  if (c.v_head_dim > c.head_dim())
    SLIMPI_FAIL_ALL("model.v_head_dim = {} ({}) exceeds the query/key head dimension {} (qk_nope_head_dim + "
                    "qk_rope_head_dim): not supported", c.v_head_dim, deck.source("model.v_head_dim"), c.head_dim());
  if (c.qkv_bias || c.o_bias || c.qk_norm || c.partial_rotary_factor != 1.0)
    SLIMPI_FAIL_ALL("multi-head latent attention (model.kv_lora_rank = {}) has no q/k/v or o biases, q/k norms or "
                    "partial rotary factor (its rotary part is model.qk_rope_head_dim)", c.kv_lora_rank);
}

}  // namespace

ModelConfig ModelConfig::from_deck(const Deck& deck) {
  ModelConfig c;
  c.vocab_size = deck.get_int("model.vocab_size");
  c.hidden_size = deck.get_int("model.hidden_size");
  c.n_layers = deck.get_int("model.n_layers");
  c.n_heads = deck.get_int("model.n_heads");
  c.n_kv_heads = deck.get_int("model.n_kv_heads");
  if (c.n_kv_heads == 0) c.n_kv_heads = c.n_heads;
  c.explicit_head_dim = deck.get_int("model.head_dim");
  c.intermediate_size = deck.get_int("model.intermediate_size");
  c.max_seq_len = deck.get_int("model.max_seq_len");
  c.rope_theta = deck.get_float("model.rope_theta");
  c.rope_scaling = deck.get_string("model.rope_scaling");
  c.rope_factor = deck.get_float("model.rope_factor");
  c.rope_low_freq_factor = deck.get_float("model.rope_low_freq_factor");
  c.rope_high_freq_factor = deck.get_float("model.rope_high_freq_factor");
  c.rope_original_max_seq_len = deck.get_int("model.rope_original_max_seq_len");
  c.rope_beta_fast = deck.get_float("model.rope_beta_fast");
  c.rope_beta_slow = deck.get_float("model.rope_beta_slow");
  c.rope_mscale = deck.get_float("model.rope_mscale");
  c.rope_mscale_all_dim = deck.get_float("model.rope_mscale_all_dim");
  c.rope_attention_factor = deck.get_float("model.rope_attention_factor");
  c.rope_truncate = deck.get_bool("model.rope_truncate");
  c.rms_norm_eps = deck.get_float("model.rms_norm_eps");
  c.init_std = deck.get_float("model.init_std");
  c.tie_word_embeddings = deck.get_bool("model.tie_word_embeddings");
  c.qkv_bias = deck.get_bool("model.qkv_bias");
  c.o_bias = deck.get_bool("model.o_bias");
  c.qk_norm = deck.get_bool("model.qk_norm");
  c.n_experts = deck.get_int("model.n_experts");
  c.n_experts_per_tok = deck.get_int("model.n_experts_per_tok");
  c.moe_intermediate_size = deck.get_int("model.moe_intermediate_size");
  if (c.moe_intermediate_size == 0) c.moe_intermediate_size = c.intermediate_size;
  c.norm_topk_prob = deck.get_bool("model.norm_topk_prob");
  c.moe_layer_freq = deck.get_int("model.moe_layer_freq");
  c.shared_expert_intermediate_size = deck.get_int("model.shared_expert_intermediate_size");
  c.mtp_num_layers = deck.get_int("model.mtp_num_layers");
  c.moe_router = deck.get_string("model.moe_router");
  c.moe_router_bias = deck.get_bool("model.moe_router_bias");
  c.moe_n_group = deck.get_int("model.moe_n_group");
  c.moe_topk_group = deck.get_int("model.moe_topk_group");
  c.moe_routed_scaling_factor = deck.get_float("model.moe_routed_scaling_factor");
  c.n_shared_experts = deck.get_int("model.n_shared_experts");
  c.first_k_dense_replace = deck.get_int("model.first_k_dense_replace");
  c.partial_rotary_factor = deck.get_float("model.partial_rotary_factor");
  c.kv_lora_rank = deck.get_int("model.kv_lora_rank");
  c.q_lora_rank = deck.get_int("model.q_lora_rank");
  c.qk_nope_head_dim = deck.get_int("model.qk_nope_head_dim");
  c.qk_rope_head_dim = deck.get_int("model.qk_rope_head_dim");
  c.v_head_dim = deck.get_int("model.v_head_dim");
  c.rope_interleave = deck.get_bool("model.rope_interleave");
  c.full_attention_interval = deck.get_int("model.full_attention_interval");
  c.linear_num_key_heads = deck.get_int("model.linear_num_key_heads");
  c.linear_num_value_heads = deck.get_int("model.linear_num_value_heads");
  c.linear_key_head_dim = deck.get_int("model.linear_key_head_dim");
  c.linear_value_head_dim = deck.get_int("model.linear_value_head_dim");
  c.linear_conv_kernel_dim = deck.get_int("model.linear_conv_kernel_dim");
  c.linear_fused_projections = deck.get_bool("model.linear_fused_projections");
  c.attn_output_gate = deck.get_bool("model.attn_output_gate");
  c.zero_centered_norm = deck.get_bool("model.zero_centered_norm");
  check_deepseek_moe(c, deck);
  check_linear_attention(c, deck);
  check_mla(c, deck);
  if (c.is_mla()) c.n_kv_heads = c.n_heads;  // every head its own key and value once the latent is expanded
  if (c.n_experts > 0 && c.n_experts_per_tok > c.n_experts)
    SLIMPI_FAIL_ALL("model.n_experts_per_tok = {} ({}) exceeds model.n_experts = {} ({})", c.n_experts_per_tok,
                    deck.source("model.n_experts_per_tok"), c.n_experts, deck.source("model.n_experts"));
  if (c.n_experts > 0 && c.n_moe_layers() == 0)
    SLIMPI_FAIL_ALL("model.moe_layer_freq = {} ({}) and model.first_k_dense_replace = {} ({}) leave none of the {} "
                    "layers sparse", c.moe_layer_freq, deck.source("model.moe_layer_freq"), c.first_k_dense_replace,
                    deck.source("model.first_k_dense_replace"), c.n_layers);
  if (!c.is_mla() && c.explicit_head_dim == 0 && c.hidden_size % c.n_heads != 0)
    SLIMPI_FAIL_ALL("model.hidden_size = {} must be a multiple of model.n_heads = {} (or set model.head_dim)",
                    c.hidden_size, c.n_heads);
  if (!c.is_mla() && c.head_dim() % 2 != 0)
    SLIMPI_FAIL_ALL("the head dimension {} ({}) must be even (RoPE rotates pairs)", c.head_dim(),
                    c.explicit_head_dim > 0 ? "model.head_dim" : "model.hidden_size / model.n_heads");
  if (c.rotary_dim() < 2 || c.rotary_dim() % 2 != 0)
    SLIMPI_FAIL_ALL("model.partial_rotary_factor = {} ({}) rotates {} of the head's {} dimensions: RoPE needs an "
                    "even number, at least 2", c.partial_rotary_factor, deck.source("model.partial_rotary_factor"),
                    c.rotary_dim(), c.head_dim());
  if (c.n_heads % c.n_kv_heads != 0)
    SLIMPI_FAIL_ALL("model.n_heads = {} must be a multiple of model.n_kv_heads = {}", c.n_heads, c.n_kv_heads);
  if (c.rope_scaling == "llama3" && !(c.rope_high_freq_factor > c.rope_low_freq_factor))
    SLIMPI_FAIL_ALL("model.rope_high_freq_factor = {} ({}) must exceed model.rope_low_freq_factor = {} ({}) for "
                    "model.rope_scaling = \"llama3\"",
                    c.rope_high_freq_factor, deck.source("model.rope_high_freq_factor"), c.rope_low_freq_factor,
                    deck.source("model.rope_low_freq_factor"));
  return c;
}

}  // namespace slimpi
