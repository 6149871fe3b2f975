#include "model/transformer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <slimpi/error.h>

#include <ATen/ops/scaled_dot_product_attention.h>

#include <cmath>
#include <optional>
#include <tuple>

#include "kernels/paged_attention.h"

namespace slimpi {
namespace {

// RMSNorm in fp32: x * rsqrt(mean(x^2) + eps) * w.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor r = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (xf * r).to(x.scalar_type()) * w;
}

// RoPE, Hugging Face's rotate-half layout: x * cos + rotate_half(x) * sin.
// x [T, heads, D], cos/sin [T, 1, D].
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

// Batched causal attention over padded sequences.
// q [B, Lq, H, D], k/v [B, Lk, Hkv, D]; query j of sequence b sits at position
// q_pos[b][j] and sees keys 0..q_pos[b][j] that exist (key index < n_keys[b]).
// Grouped-query: head h reads kv head h / (H / Hkv). Returns [B, Lq, H, D].
at::Tensor attend_padded(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& q_pos,
                         const at::Tensor& n_keys) {
  const int64_t B = q.size(0), Lq = q.size(1), H = q.size(2), D = q.size(3);
  const int64_t Lk = k.size(1), Hkv = k.size(2), g = H / Hkv;
  at::Tensor qh = q.reshape({B, Lq, Hkv, g, D}).permute({0, 2, 3, 1, 4});  // [B, Hkv, g, Lq, D]
  at::Tensor kh = k.permute({0, 2, 3, 1}).unsqueeze(2);                    // [B, Hkv, 1, D, Lk]
  at::Tensor vh = v.permute({0, 2, 1, 3}).unsqueeze(2);                    // [B, Hkv, 1, Lk, D]
  at::Tensor scores = at::matmul(qh, kh) * (1.0 / std::sqrt(double(D)));  // [B, Hkv, g, Lq, Lk]
  at::Tensor key = at::arange(Lk, q_pos.options()).view({1, 1, Lk});       // [1, 1, Lk]
  at::Tensor hidden = (key > q_pos.unsqueeze(2)) | (key >= n_keys.view({B, 1, 1}));  // [B, Lq, Lk]
  scores = scores.masked_fill(hidden.view({B, 1, 1, Lq, Lk}), -std::numeric_limits<float>::infinity());
  at::Tensor probs = at::softmax(scores.to(at::kFloat), -1).to(v.scalar_type());
  return at::matmul(probs, vh).permute({0, 3, 1, 2, 4}).reshape({B, Lq, H, D});  // [B, Lq, H, D]
}

// Causal attention of one sequence through torch's scaled_dot_product_attention (a
// flash kernel on CPU and GPU: score memory O(block) per head, never O(L²)).
// q [Lq, H, D]: the queries at positions n_past..n_past+Lq-1; k/v [n_past + Lq, Hkv, D].
// Query i sees keys 0..n_past+i: the causal flag when n_past = 0, else a [Lq, Lk] boolean
// mask (SDPA's causal flag aligns the diagonal top-left). Grouped-query: head h reads kv
// head h / (H / Hkv). Returns [Lq, H, D].
at::Tensor attend_one_sequence(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t n_past) {
  const int64_t Lq = q.size(0), Lk = k.size(0), g = q.size(1) / k.size(1);
  auto heads_first = [](const at::Tensor& x) { return x.transpose(0, 1).unsqueeze(0); };  // [1, heads, L, D]
  at::Tensor kh = heads_first(k), vh = heads_first(v);
  if (g > 1) {
    kh = kh.repeat_interleave(g, 1);  // [1, H, Lk, D]
    vh = vh.repeat_interleave(g, 1);
  }
  std::optional<at::Tensor> mask;
  if (n_past > 0) {
    const auto opts = at::TensorOptions().dtype(at::kLong).device(q.device());
    mask = at::arange(Lk, opts).view({1, Lk}) <= (at::arange(Lq, opts) + n_past).view({Lq, 1});  // [Lq, Lk]
  }
  return at::scaled_dot_product_attention(heads_first(q), kh, vh, mask, 0.0, /*is_causal=*/n_past == 0)
      .squeeze(0)
      .transpose(0, 1);  // [Lq, H, D]
}

// Causal attention of B packed sequences without padding, each alone (above).
// q [T, H, D], k/v [T, Hkv, D], sequences back to back with lengths seq_lens.
// Returns [T, H, D].
at::Tensor attend_unpadded(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::vector<int64_t>& seq_lens) {
  std::vector<at::Tensor> out;
  int64_t start = 0;
  for (int64_t L : seq_lens) {
    out.push_back(attend_one_sequence(q.narrow(0, start, L), k.narrow(0, start, L), v.narrow(0, start, L), 0));
    start += L;
  }
  return at::cat(out);
}

}  // namespace

// Token t of the packed input is query row (b_of_t[t], j_of_t[t]) of the padded batch.
struct Transformer::AttentionLayout {
  int64_t n_seqs = 0, max_new = 0, max_keys = 0;
  at::Tensor b_of_t, j_of_t;  // [T]
  at::Tensor positions;       // [T] absolute position of every token
  at::Tensor q_pos;           // [B, max_new] absolute position of every padded query
  at::Tensor n_keys;          // [B] keys each sequence attends to (past + new)
  at::Tensor new_slots;       // cached: [T] cache slot of every new token
  at::Tensor key_slots;       // cached: [B * max_keys] slot of every padded key (0 where padding)
  std::vector<int64_t> seq_lens;  // packed (no cache): each sequence's length
  std::vector<int64_t> n_past_host, n_new_host;  // [B] each, on the host
  // Incremental batches holding both decode (one new token) and prefill sequences: the
  // two attend in separate calls, so decode rows are never padded to a prefill chunk.
  // Each part: its own layout over its sequences, and token_index [T_part], the rows of
  // the packed batch its tokens are.
  struct Part;
  std::vector<Part> parts;
};

struct Transformer::AttentionLayout::Part {
  AttentionLayout layout;
  at::Tensor token_index;
};

namespace {

// The layout of B sequences with n_past[b] cached and n_new[b] new tokens.
// slots: the cache slots of every position of each sequence (empty: packed, no cache).
Transformer::AttentionLayout make_layout(const std::vector<int64_t>& n_past, const std::vector<int64_t>& n_new,
                                         const std::vector<at::Tensor>& slots, const at::Device& device) {
  Transformer::AttentionLayout a;
  a.n_seqs = static_cast<int64_t>(n_new.size());
  a.n_past_host = n_past;
  a.n_new_host = n_new;
  std::vector<int64_t> b_of_t, j_of_t, pos, n_keys;
  for (int64_t b = 0; b < a.n_seqs; ++b) {
    a.max_new = std::max(a.max_new, n_new[b]);
    a.max_keys = std::max(a.max_keys, n_past[b] + n_new[b]);
    n_keys.push_back(n_past[b] + n_new[b]);
    for (int64_t j = 0; j < n_new[b]; ++j) {
      b_of_t.push_back(b);
      j_of_t.push_back(j);
      pos.push_back(n_past[b] + j);
    }
  }
  const auto opts = at::TensorOptions().dtype(at::kLong);
  a.b_of_t = at::tensor(b_of_t, opts).to(device);
  a.j_of_t = at::tensor(j_of_t, opts).to(device);
  a.positions = at::tensor(pos, opts).to(device);
  a.n_keys = at::tensor(n_keys, opts).to(device);
  at::Tensor past = at::tensor(n_past, opts).view({a.n_seqs, 1});
  a.q_pos = (past + at::arange(a.max_new, opts).view({1, a.max_new})).to(device);
  if (!slots.empty()) {
    std::vector<at::Tensor> fresh, padded;
    for (int64_t b = 0; b < a.n_seqs; ++b) {
      at::Tensor s = slots[b].to(at::kCPU);
      fresh.push_back(s.narrow(0, n_past[b], n_new[b]));
      padded.push_back(at::constant_pad_nd(s, {0, a.max_keys - s.size(0)}, 0));
    }
    a.new_slots = at::cat(fresh).to(device);
    a.key_slots = at::cat(padded).to(device);
  }
  return a;
}

}  // namespace

KvCache KvCache::allocate(const ModelConfig& cfg, int64_t n_slots, const at::TensorOptions& options) {
  KvCache c;
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    c.k.push_back(at::zeros({n_slots, cfg.n_kv_heads, cfg.head_dim()}, options));
    c.v.push_back(at::zeros({n_slots, cfg.n_kv_heads, cfg.head_dim()}, options));
  }
  if (cfg.n_experts > 0)
    c.routing = at::full({n_slots, cfg.n_moe_layers(), cfg.n_experts_per_tok}, -1, options.dtype(at::kShort));
  return c;
}

void Transformer::add(const std::string& name, at::Tensor t) {
  params_.push_back({name, t.to(device_, weights_).set_requires_grad(true)});
}

void Transformer::pack_parameters() {
  int64_t total = 0;
  for (const auto& p : params_) {
    SLIMPI_CHECK(p.tensor.scalar_type() == weights_, "parameter {} is not {}", p.name,
                 std::string(c10::toString(weights_)));
    total += p.tensor.numel();
  }
  flat_ = at::empty({total}, params_.front().tensor.options().requires_grad(false));
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& p : params_) {
    at::Tensor view = flat_.narrow(0, offset, p.tensor.numel()).view(p.tensor.sizes());
    view.copy_(p.tensor);
    offset += p.tensor.numel();
    p.tensor = view.detach().set_requires_grad(true);  // a leaf that shares flat_'s storage
  }
}

Transformer::Transformer(const ModelConfig& cfg, uint64_t seed, const at::Device& device, at::ScalarType weights,
                         const ExpertShard& experts)
    : cfg_(cfg), device_(device), weights_(weights), experts_(experts) {
  SLIMPI_CHECK(experts.size == 1 || (cfg.n_experts > 0 && cfg.n_experts % experts.size == 0 && experts.comm &&
                                     experts.rank >= 0 && experts.rank < experts.size),
               "expert shard {} of {} for a model of {} experts (the group size must divide the expert count)",
               experts.rank, experts.size, cfg.n_experts);
  SLIMPI_CHECK(weights == at::kFloat || weights == at::kBFloat16, "model weights in {}: only fp32 or bf16",
               std::string(c10::toString(weights)));
  // All parameters drawn on the CPU from one generator, in name order, then moved.
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const int64_t d = cfg.hidden_size, hd = cfg.head_dim(), q_width = cfg.n_heads * hd, kv = cfg.n_kv_heads * hd,
                f = cfg.intermediate_size;
  auto normal = [&](std::vector<int64_t> shape) { return at::normal(0.0, cfg.init_std, shape, gen); };
  auto ones = [&](int64_t n) { return at::ones({n}, at::kFloat); };
  auto zeros = [&](int64_t n) { return at::zeros({n}, at::kFloat); };

  add("model.embed_tokens.weight", normal({cfg.vocab_size, d}));
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", ones(d));
    add(p + "self_attn.q_proj.weight", normal({q_width, d}));
    add(p + "self_attn.k_proj.weight", normal({kv, d}));
    add(p + "self_attn.v_proj.weight", normal({kv, d}));
    if (cfg.qkv_bias) {
      add(p + "self_attn.q_proj.bias", zeros(q_width));
      add(p + "self_attn.k_proj.bias", zeros(kv));
      add(p + "self_attn.v_proj.bias", zeros(kv));
    }
    add(p + "self_attn.o_proj.weight", normal({d, q_width}));
    if (cfg.o_bias) add(p + "self_attn.o_proj.bias", zeros(d));
    if (cfg.qk_norm) {
      add(p + "self_attn.q_norm.weight", ones(hd));
      add(p + "self_attn.k_norm.weight", ones(hd));
    }
    add(p + "post_attention_layernorm.weight", ones(d));
    if (cfg.is_moe_layer(l)) {  // Qwen3-MoE names: the router, then each expert's MLP
      const int64_t fe = cfg.moe_intermediate_size;
      add(p + "mlp.gate.weight", normal({cfg.n_experts, d}));
      // Every expert is drawn (the generator's sequence does not depend on the shard);
      // an expert-parallel shard keeps its own block.
      const int64_t first = experts.first(cfg.n_experts), last = first + experts.count(cfg.n_experts);
      for (int64_t e = 0; e < cfg.n_experts; ++e) {
        const std::string pe = p + "mlp.experts." + std::to_string(e) + ".";
        at::Tensor gate = normal({fe, d}), up = normal({fe, d}), down = normal({d, fe});
        if (e < first || e >= last) continue;
        add(pe + "gate_proj.weight", gate);
        add(pe + "up_proj.weight", up);
        add(pe + "down_proj.weight", down);
      }
      if (const int64_t fs = cfg.shared_expert_intermediate_size; fs > 0) {  // Qwen2-MoE
        add(p + "mlp.shared_expert.gate_proj.weight", normal({fs, d}));
        add(p + "mlp.shared_expert.up_proj.weight", normal({fs, d}));
        add(p + "mlp.shared_expert.down_proj.weight", normal({d, fs}));
        add(p + "mlp.shared_expert_gate.weight", normal({1, d}));
      }
    } else {
      add(p + "mlp.gate_proj.weight", normal({f, d}));
      add(p + "mlp.up_proj.weight", normal({f, d}));
      add(p + "mlp.down_proj.weight", normal({d, f}));
    }
  }
  add("model.norm.weight", ones(d));
  if (!cfg.tie_word_embeddings) add("lm_head.weight", normal({cfg.vocab_size, d}));
  pack_parameters();

  embed_ = parameter("model.embed_tokens.weight");
  final_norm_ = parameter("model.norm.weight");
  lm_head_ = cfg.tie_word_embeddings ? embed_ : parameter("lm_head.weight");
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerParams lp;
    lp.input_norm = parameter(p + "input_layernorm.weight");
    lp.q = parameter(p + "self_attn.q_proj.weight");
    lp.k = parameter(p + "self_attn.k_proj.weight");
    lp.v = parameter(p + "self_attn.v_proj.weight");
    if (cfg.qkv_bias) {
      lp.q_bias = parameter(p + "self_attn.q_proj.bias");
      lp.k_bias = parameter(p + "self_attn.k_proj.bias");
      lp.v_bias = parameter(p + "self_attn.v_proj.bias");
    }
    lp.o = parameter(p + "self_attn.o_proj.weight");
    if (cfg.o_bias) lp.o_bias = parameter(p + "self_attn.o_proj.bias");
    if (cfg.qk_norm) {
      lp.q_norm = parameter(p + "self_attn.q_norm.weight");
      lp.k_norm = parameter(p + "self_attn.k_norm.weight");
    }
    lp.post_norm = parameter(p + "post_attention_layernorm.weight");
    if (cfg.is_moe_layer(l)) {
      lp.moe.router = parameter(p + "mlp.gate.weight");
      lp.moe.first_expert = experts.first(cfg.n_experts);
      lp.moe.ep = experts.size > 1 ? experts.comm : nullptr;
      for (int64_t e = lp.moe.first_expert; e < lp.moe.first_expert + experts.count(cfg.n_experts); ++e) {
        const std::string pe = p + "mlp.experts." + std::to_string(e) + ".";
        lp.moe.gate.push_back(parameter(pe + "gate_proj.weight"));
        lp.moe.up.push_back(parameter(pe + "up_proj.weight"));
        lp.moe.down.push_back(parameter(pe + "down_proj.weight"));
      }
      if (cfg.shared_expert_intermediate_size > 0) {
        lp.moe.shared_gate_proj = parameter(p + "mlp.shared_expert.gate_proj.weight");
        lp.moe.shared_up = parameter(p + "mlp.shared_expert.up_proj.weight");
        lp.moe.shared_down = parameter(p + "mlp.shared_expert.down_proj.weight");
        lp.moe.shared_gate = parameter(p + "mlp.shared_expert_gate.weight");
      }
    } else {
      lp.gate = parameter(p + "mlp.gate_proj.weight");
      lp.up = parameter(p + "mlp.up_proj.weight");
      lp.down = parameter(p + "mlp.down_proj.weight");
    }
    layers_.push_back(lp);
  }

  // RoPE tables: angle(pos, i) = pos * f_i (f_i = theta^(-2i/D), scaled as the config
  // says), duplicated over both halves.
  at::Tensor inv_freq = at::tensor(cfg.rope_inv_freq(), at::kDouble);                            // [D/2]
  at::Tensor angles = at::outer(at::arange(cfg.max_seq_len, at::kDouble), inv_freq);             // [S, D/2]
  at::Tensor full = at::cat({angles, angles}, -1);                                                // [S, D]
  rope_cos_ = full.cos().to(at::kFloat).to(device_);
  rope_sin_ = full.sin().to(at::kFloat).to(device_);
}

void Transformer::copy_weights_from(const Transformer& other) {
  SLIMPI_CHECK(other.flat_.numel() == flat_.numel() && other.params_.size() == params_.size(),
               "copy_weights_from: models of {} and {} parameters", other.flat_.numel(), flat_.numel());
  at::NoGradGuard no_grad;
  flat_.copy_(other.flat_);  // one pass: the layouts are the same, element for element
}

bool Transformer::is_expert_parameter(const std::string& name) {
  return name.find(".mlp.experts.") != std::string::npos;
}

at::Tensor& Transformer::parameter(const std::string& name) {
  for (auto& p : params_)
    if (p.name == name) return p.tensor;
  SLIMPI_FAIL("model has no parameter '{}'", name);
}

int64_t Transformer::n_params() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.tensor.numel();
  return n;
}

at::Tensor Transformer::forward(const at::Tensor& tokens, const AttentionLayout& a, KvCache* cache,
                                MoeTrace* moe) const {
  const int64_t T = tokens.size(0), H = cfg_.n_heads, Hkv = cfg_.n_kv_heads, D = cfg_.head_dim();
  if (moe) {
    moe->router_logits.clear();
    moe->chosen = at::Tensor();
    moe->routed = at::Tensor();
    SLIMPI_CHECK(!moe->replay.defined() || (moe->replay.dim() == 3 && moe->replay.size(0) == T &&
                                            moe->replay.size(1) == cfg_.n_moe_layers()),
                 "routing replay: expert ids for {} tokens and {} MoE layers expected", T, cfg_.n_moe_layers());
  }
  std::vector<at::Tensor> chosen, own;  // per MoE layer [T, k]: experts run, the router's own top-k
  int64_t moe_layer = 0;
  // In a bf16 forward every weight is used as its bf16 rounding, as autocast does for
  // the matrix products: the embedding and the norm weights too, so fp32 masters
  // (training) and bf16 weights (a bf16 engine) compute the same thing.
  const bool bf16 = at::autocast::is_autocast_enabled(device_.type()) &&
                    at::autocast::get_autocast_dtype(device_.type()) == at::kBFloat16;
  auto as_used = [&](const at::Tensor& w) { return bf16 ? w.to(at::kBFloat16) : w; };
  const int64_t B = a.n_seqs, Lq = a.max_new, Lk = a.max_keys;
  // Packed sequences attend without padding once the padded scores would outgrow the
  // budget; below it the padded batch (a few large ops) is faster for many short ones.
  const bool unpadded = !cache && B * H * Lq * Lk > padded_attention_budget_;
  // Auto: the paged kernel for an fp32 forward on the CPU. A bf16 forward gathers and
  // runs the same attention ops as the bf16 trainer (padded batches below the budget,
  // per-sequence SDPA above it), so where both take the same path a bf16 engine samples
  // with the log-probs a bf16 trainer recomputes (the kernel accumulates in fp32 and
  // would differ at bf16 rounding everywhere).
  const DecodeAttention decode_mode = decode_attention_ != DecodeAttention::Auto ? decode_attention_
                                      : device_.is_cpu() && !bf16                ? DecodeAttention::Paged
                                                                                 : DecodeAttention::Gather;
  at::Tensor cos = rope_cos_.index_select(0, a.positions).unsqueeze(1);  // [T, 1, D]
  at::Tensor sin = rope_sin_.index_select(0, a.positions).unsqueeze(1);  // [T, 1, D]
  // Scatter the [T_l, heads, D] rows of layout l's tokens into a zero-padded
  // [B_l, Lq_l, heads, D] batch.
  auto pad = [&](const at::Tensor& x, const AttentionLayout& l) {
    return at::zeros({l.n_seqs, l.max_new, x.size(1), D}, x.options()).index_put({l.b_of_t, l.j_of_t}, x);
  };
  at::Tensor x = at::embedding(as_used(embed_), tokens).to(at::kFloat);  // [T, d]: the residual stream is fp32
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerParams& p = layers_[l];
    at::Tensor h = rms_norm(x, as_used(p.input_norm), cfg_.rms_norm_eps);
    at::Tensor q = at::linear(h, p.q, p.q_bias).view({T, H, D});    // [T, H, D]
    at::Tensor k = at::linear(h, p.k, p.k_bias).view({T, Hkv, D});  // [T, Hkv, D]
    if (cfg_.qk_norm) {  // Qwen3: each head RMS-normalised before RoPE
      q = rms_norm(q, as_used(p.q_norm), cfg_.rms_norm_eps);
      k = rms_norm(k, as_used(p.k_norm), cfg_.rms_norm_eps);
    }
    q = apply_rope(q, cos, sin);
    k = apply_rope(k, cos, sin);
    at::Tensor v = at::linear(h, p.v, p.v_bias).view({T, Hkv, D});                        // [T, Hkv, D]
    at::Tensor attn;  // [T, H * D]
    if (unpadded) {
      attn = attend_unpadded(q, k, v, a.seq_lens).reshape({T, H * D});
    } else if (cache) {
      cache->k[l].index_copy_(0, a.new_slots, k.to(cache->k[l].scalar_type()));
      cache->v[l].index_copy_(0, a.new_slots, v.to(cache->v[l].scalar_type()));
      // Queries of `part` against their sequences' cached keys (padded within the part,
      // except for the paged kernel, which reads one query row per sequence).
      auto attend_cached = [&](const AttentionLayout& part, const at::Tensor& q_part) {  // -> [T_part, H, D]
        const int64_t Bp = part.n_seqs, Lkp = part.max_keys;
        if (part.max_new == 1 && decode_mode == DecodeAttention::Paged)  // decode rows: q_part row b is sequence b
          return paged_decode_attention(q_part, cache->k[l], cache->v[l], part.key_slots.view({Bp, Lkp}), part.n_keys);
        auto gathered = [&](const at::Tensor& slots) {  // -> K, V [n, Hkv, D] in the reused buffer
          const int64_t rows = slots.size(0);
          if (!cache->gathered_k.defined() || cache->gathered_k.size(0) < rows) {  // grow, never shrink
            cache->gathered_k = at::empty({rows, Hkv, D}, cache->k[l].options());
            cache->gathered_v = at::empty({rows, Hkv, D}, cache->v[l].options());
          }
          at::Tensor kg = cache->gathered_k.narrow(0, 0, rows), vg = cache->gathered_v.narrow(0, 0, rows);
          at::index_select_out(kg, cache->k[l], 0, slots);
          at::index_select_out(vg, cache->v[l], 0, slots);
          return std::pair{kg.to(k.scalar_type()), vg.to(v.scalar_type())};
        };
        // Long prefill chunks: each sequence alone through SDPA, no [B, H, Lq, Lk] scores.
        if (part.max_new > 1 && decode_mode != DecodeAttention::FreshGather &&
            Bp * H * part.max_new * Lkp > padded_attention_budget_) {
          std::vector<at::Tensor> outs;
          for (int64_t b = 0, row = 0; b < Bp; row += part.n_new_host[b], ++b) {
            const int64_t n_past = part.n_past_host[b], n_new = part.n_new_host[b];
            auto [kb, vb] = gathered(part.key_slots.narrow(0, b * Lkp, n_past + n_new));
            outs.push_back(attend_one_sequence(q_part.narrow(0, row, n_new), kb, vb, n_past));
          }
          return at::cat(outs);
        }
        at::Tensor kp, vp;  // [Bp, Lkp, Hkv, D]
        if (decode_mode == DecodeAttention::FreshGather) {
          kp = cache->k[l].index_select(0, part.key_slots);
          vp = cache->v[l].index_select(0, part.key_slots);
        } else {
          std::tie(kp, vp) = gathered(part.key_slots);
        }
        kp = kp.view({Bp, Lkp, Hkv, D}).to(k.scalar_type());
        vp = vp.view({Bp, Lkp, Hkv, D}).to(v.scalar_type());
        return attend_padded(pad(q_part, part), kp, vp, part.q_pos, part.n_keys).index({part.b_of_t, part.j_of_t});
      };
      if (a.parts.empty()) {
        attn = attend_cached(a, q).reshape({T, H * D});
      } else {
        std::vector<at::Tensor> outs;  // [T_part, H, D] each, in the forward's compute dtype
        for (const auto& part : a.parts) outs.push_back(attend_cached(part.layout, q.index_select(0, part.token_index)));
        attn = at::empty({T, H, D}, outs.front().options());
        for (size_t i = 0; i < outs.size(); ++i)  // parts may differ: the paged kernel answers in q's dtype
          attn.index_copy_(0, a.parts[i].token_index, outs[i].to(attn.scalar_type()));
        attn = attn.reshape({T, H * D});
      }
    } else {
      attn = attend_padded(pad(q, a), pad(k, a), pad(v, a), a.q_pos, a.n_keys)  // [B, Lq, H, D]
                 .index({a.b_of_t, a.j_of_t})                                   // [T, H, D]
                 .reshape({T, H * D});
    }
    x = x + at::linear(attn, p.o, p.o_bias);
    h = rms_norm(x, as_used(p.post_norm), cfg_.rms_norm_eps);
    if (!cfg_.is_moe_layer(l)) {
      x = x + at::linear(at::silu(at::linear(h, p.gate)) * at::linear(h, p.up), p.down);
      continue;
    }
    const at::Tensor replay = moe && moe->replay.defined() ? moe->replay.select(1, moe_layer) : at::Tensor();
    MoeLayerOutput routed = moe_mlp(h, p.moe, cfg_.n_experts_per_tok, cfg_.norm_topk_prob, replay);
    x = x + routed.out;
    if (moe) {
      chosen.push_back(routed.chosen);
      own.push_back(routed.routed);
      moe->router_logits.push_back(routed.router_logits);
    }
    ++moe_layer;
  }
  if (moe && !chosen.empty()) {
    moe->chosen = at::stack(chosen, 1);  // [T, n_moe_layers, k]
    moe->routed = at::stack(own, 1);
  }
  x = rms_norm(x, as_used(final_norm_), cfg_.rms_norm_eps);
  return at::linear(x, lm_head_).to(at::kFloat);  // [T, V]
}

at::Tensor Transformer::forward_packed(const at::Tensor& tokens, const std::vector<int64_t>& seq_lens,
                                      MoeTrace* moe) const {
  int64_t total = 0;
  for (int64_t n : seq_lens) {
    SLIMPI_CHECK(n > 0 && n <= cfg_.max_seq_len, "sequence of {} tokens (model.max_seq_len = {})", n,
                 cfg_.max_seq_len);
    total += n;
  }
  SLIMPI_CHECK(total == tokens.size(0), "forward_packed: {} tokens but lengths sum to {}", tokens.size(0), total);
  AttentionLayout layout = make_layout(std::vector<int64_t>(seq_lens.size(), 0), seq_lens, {}, device_);
  layout.seq_lens = seq_lens;
  return forward(tokens, layout, nullptr, moe);
}

at::Tensor Transformer::forward_incremental(const at::Tensor& tokens, const std::vector<CachedSequence>& seqs,
                                            KvCache& cache, MoeTrace* moe) const {
  std::vector<int64_t> n_past, n_new;
  std::vector<at::Tensor> slots;
  for (const auto& s : seqs) {
    SLIMPI_CHECK(s.n_new > 0 && s.n_past + s.n_new <= cfg_.max_seq_len,
                 "cached sequence of {} + {} tokens (model.max_seq_len = {})", s.n_past, s.n_new, cfg_.max_seq_len);
    SLIMPI_CHECK(s.slots.numel() == s.n_past + s.n_new, "sequence has {} slots for {} positions", s.slots.numel(),
                 s.n_past + s.n_new);
    n_past.push_back(s.n_past);
    n_new.push_back(s.n_new);
    slots.push_back(s.slots);
  }
  AttentionLayout layout = make_layout(n_past, n_new, slots, device_);
  // Decode sequences and prefill chunks in one batch attend apart (see AttentionLayout).
  const bool decodes = std::any_of(n_new.begin(), n_new.end(), [](int64_t n) { return n == 1; });
  const bool prefills = std::any_of(n_new.begin(), n_new.end(), [](int64_t n) { return n > 1; });
  if (decodes && prefills && split_decode_and_prefill_) {
    for (bool decode : {true, false}) {
      std::vector<int64_t> past, fresh, rows;
      std::vector<at::Tensor> part_slots;
      int64_t row = 0;
      for (size_t i = 0; i < seqs.size(); ++i) {
        if ((n_new[i] == 1) == decode) {
          past.push_back(n_past[i]);
          fresh.push_back(n_new[i]);
          part_slots.push_back(slots[i]);
          for (int64_t j = 0; j < n_new[i]; ++j) rows.push_back(row + j);
        }
        row += n_new[i];
      }
      AttentionLayout::Part part;
      part.layout = make_layout(past, fresh, part_slots, device_);
      part.token_index = at::tensor(rows, at::kLong).to(device_);
      layout.parts.push_back(std::move(part));
    }
  }
  return forward(tokens, layout, &cache, moe);
}

}  // namespace slimpi
