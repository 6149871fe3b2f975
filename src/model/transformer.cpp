#include "model/transformer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <slimpi/error.h>

#include <cmath>

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

// Causal attention of one sequence's n_new queries over its n_past + n_new keys.
// q [n_new, H, D], k/v [n_total, Hkv, D] -> [n_new, H, D]. Query i sits at position
// n_past + i and sees keys 0..n_past+i. Grouped-query: head h reads kv head h / (H/Hkv).
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t n_past) {
  const int64_t n_new = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t n_total = k.size(0), kv_heads = k.size(1), group = heads / kv_heads;
  at::Tensor qh = q.reshape({n_new, kv_heads, group, d}).permute({1, 2, 0, 3});  // [Hkv, g, n_new, D]
  at::Tensor kh = k.permute({1, 2, 0}).unsqueeze(1);                              // [Hkv, 1, D, n_total]
  at::Tensor vh = v.permute({1, 0, 2}).unsqueeze(1);                              // [Hkv, 1, n_total, D]
  at::Tensor scores = at::matmul(qh, kh) * (1.0 / std::sqrt(double(d)));          // [Hkv, g, n_new, n_total]
  if (n_new > 1) {
    // key j is hidden from query i when j > n_past + i
    at::Tensor qi = at::arange(n_new, scores.options().dtype(at::kLong)).unsqueeze(1) + n_past;
    at::Tensor kj = at::arange(n_total, scores.options().dtype(at::kLong)).unsqueeze(0);
    scores = scores.masked_fill(kj > qi, -std::numeric_limits<float>::infinity());
  }
  at::Tensor probs = at::softmax(scores.to(at::kFloat), -1).to(v.scalar_type());
  return at::matmul(probs, vh).permute({2, 0, 1, 3}).reshape({n_new, heads, d});  // [n_new, H, D]
}

}  // namespace

// Where a sequence's keys/values come from in a layer: the fresh ones (packed) or the
// cache after the fresh ones are written into it (incremental).
class Transformer::KvSource {
 public:
  virtual ~KvSource() = default;
  // k_new/v_new [n_new, Hkv, D] of sequence b in `layer`; returns (k, v) [n_total, Hkv, D].
  virtual std::pair<at::Tensor, at::Tensor> keys_values(int64_t layer, size_t b, const at::Tensor& k_new,
                                                        const at::Tensor& v_new) = 0;
  virtual int64_t n_past(size_t b) const = 0;
};

namespace {

class FreshKv : public Transformer::KvSource {
 public:
  std::pair<at::Tensor, at::Tensor> keys_values(int64_t, size_t, const at::Tensor& k_new,
                                                const at::Tensor& v_new) override {
    return {k_new, v_new};
  }
  int64_t n_past(size_t) const override { return 0; }
};

class CachedKv : public Transformer::KvSource {
 public:
  CachedKv(const std::vector<CachedSequence>& seqs, KvCache& cache) : seqs_(seqs), cache_(cache) {}
  std::pair<at::Tensor, at::Tensor> keys_values(int64_t layer, size_t b, const at::Tensor& k_new,
                                                const at::Tensor& v_new) override {
    const CachedSequence& s = seqs_[b];
    at::Tensor new_slots = s.slots.narrow(0, s.n_past, s.n_new);
    cache_.k[layer].index_copy_(0, new_slots, k_new.to(cache_.k[layer].scalar_type()));
    cache_.v[layer].index_copy_(0, new_slots, v_new.to(cache_.v[layer].scalar_type()));
    return {cache_.k[layer].index_select(0, s.slots).to(k_new.scalar_type()),
            cache_.v[layer].index_select(0, s.slots).to(v_new.scalar_type())};
  }
  int64_t n_past(size_t b) const override { return seqs_[b].n_past; }

 private:
  const std::vector<CachedSequence>& seqs_;
  KvCache& cache_;
};

}  // namespace

KvCache KvCache::allocate(const ModelConfig& cfg, int64_t n_slots, const at::TensorOptions& options) {
  KvCache c;
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    c.k.push_back(at::zeros({n_slots, cfg.n_kv_heads, cfg.head_dim()}, options));
    c.v.push_back(at::zeros({n_slots, cfg.n_kv_heads, cfg.head_dim()}, options));
  }
  return c;
}

void Transformer::add(const std::string& name, at::Tensor t) {
  params_.push_back({name, t.to(device_).set_requires_grad(true)});
}

Transformer::Transformer(const ModelConfig& cfg, uint64_t seed, const at::Device& device)
    : cfg_(cfg), device_(device) {
  // All parameters drawn on the CPU from one generator, in name order, then moved.
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const int64_t d = cfg.hidden_size, kv = cfg.n_kv_heads * cfg.head_dim(), f = cfg.intermediate_size;
  auto normal = [&](std::vector<int64_t> shape) { return at::normal(0.0, cfg.init_std, shape, gen); };
  auto ones = [&](int64_t n) { return at::ones({n}, at::kFloat); };
  auto zeros = [&](int64_t n) { return at::zeros({n}, at::kFloat); };

  add("model.embed_tokens.weight", normal({cfg.vocab_size, d}));
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", ones(d));
    add(p + "self_attn.q_proj.weight", normal({d, d}));
    add(p + "self_attn.k_proj.weight", normal({kv, d}));
    add(p + "self_attn.v_proj.weight", normal({kv, d}));
    if (cfg.qkv_bias) {
      add(p + "self_attn.q_proj.bias", zeros(d));
      add(p + "self_attn.k_proj.bias", zeros(kv));
      add(p + "self_attn.v_proj.bias", zeros(kv));
    }
    add(p + "self_attn.o_proj.weight", normal({d, d}));
    add(p + "post_attention_layernorm.weight", ones(d));
    add(p + "mlp.gate_proj.weight", normal({f, d}));
    add(p + "mlp.up_proj.weight", normal({f, d}));
    add(p + "mlp.down_proj.weight", normal({d, f}));
  }
  add("model.norm.weight", ones(d));
  if (!cfg.tie_word_embeddings) add("lm_head.weight", normal({cfg.vocab_size, d}));

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
    lp.post_norm = parameter(p + "post_attention_layernorm.weight");
    lp.gate = parameter(p + "mlp.gate_proj.weight");
    lp.up = parameter(p + "mlp.up_proj.weight");
    lp.down = parameter(p + "mlp.down_proj.weight");
    layers_.push_back(lp);
  }

  // RoPE tables: angle(pos, i) = pos * theta^(-2i/D), duplicated over both halves.
  const int64_t hd = cfg.head_dim();
  at::Tensor inv_freq = at::pow(cfg.rope_theta, -at::arange(0, hd, 2, at::kDouble) / double(hd));  // [D/2]
  at::Tensor angles = at::outer(at::arange(cfg.max_seq_len, at::kDouble), inv_freq);             // [S, D/2]
  at::Tensor full = at::cat({angles, angles}, -1);                                                // [S, D]
  rope_cos_ = full.cos().to(at::kFloat).to(device_);
  rope_sin_ = full.sin().to(at::kFloat).to(device_);
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

at::Tensor Transformer::forward(const at::Tensor& tokens, const at::Tensor& positions,
                                const std::vector<int64_t>& new_lens, KvSource& kv) const {
  const int64_t T = tokens.size(0), H = cfg_.n_heads, Hkv = cfg_.n_kv_heads, D = cfg_.head_dim();
  at::Tensor cos = rope_cos_.index_select(0, positions).unsqueeze(1);  // [T, 1, D]
  at::Tensor sin = rope_sin_.index_select(0, positions).unsqueeze(1);  // [T, 1, D]
  at::Tensor x = at::embedding(embed_, tokens);                         // [T, d]
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerParams& p = layers_[l];
    at::Tensor h = rms_norm(x, p.input_norm, cfg_.rms_norm_eps);
    at::Tensor q = apply_rope(at::linear(h, p.q, p.q_bias).view({T, H, D}), cos, sin);      // [T, H, D]
    at::Tensor k = apply_rope(at::linear(h, p.k, p.k_bias).view({T, Hkv, D}), cos, sin);    // [T, Hkv, D]
    at::Tensor v = at::linear(h, p.v, p.v_bias).view({T, Hkv, D});                          // [T, Hkv, D]
    std::vector<at::Tensor> outs;
    outs.reserve(new_lens.size());
    int64_t start = 0;
    for (size_t b = 0; b < new_lens.size(); ++b) {
      const int64_t n = new_lens[b];
      auto [kb, vb] = kv.keys_values(static_cast<int64_t>(l), b, k.narrow(0, start, n), v.narrow(0, start, n));
      outs.push_back(attend(q.narrow(0, start, n), kb, vb, kv.n_past(b)));
      start += n;
    }
    at::Tensor attn = at::cat(outs, 0).view({T, H * D});  // [T, d]
    x = x + at::linear(attn, p.o);
    h = rms_norm(x, p.post_norm, cfg_.rms_norm_eps);
    x = x + at::linear(at::silu(at::linear(h, p.gate)) * at::linear(h, p.up), p.down);
  }
  x = rms_norm(x, final_norm_, cfg_.rms_norm_eps);
  return at::linear(x, lm_head_).to(at::kFloat);  // [T, V]
}

at::Tensor Transformer::forward_packed(const at::Tensor& tokens, const std::vector<int64_t>& seq_lens) const {
  std::vector<at::Tensor> pos;
  int64_t total = 0;
  for (int64_t n : seq_lens) {
    SLIMPI_CHECK(n > 0 && n <= cfg_.max_seq_len, "sequence of {} tokens (model.max_seq_len = {})", n,
                 cfg_.max_seq_len);
    pos.push_back(at::arange(n, at::TensorOptions().dtype(at::kLong).device(device_)));
    total += n;
  }
  SLIMPI_CHECK(total == tokens.size(0), "forward_packed: {} tokens but lengths sum to {}", tokens.size(0), total);
  FreshKv kv;
  return forward(tokens, at::cat(pos), seq_lens, kv);
}

at::Tensor Transformer::forward_incremental(const at::Tensor& tokens, const std::vector<CachedSequence>& seqs,
                                            KvCache& cache) const {
  std::vector<at::Tensor> pos;
  std::vector<int64_t> new_lens;
  for (const auto& s : seqs) {
    SLIMPI_CHECK(s.n_new > 0 && s.n_past + s.n_new <= cfg_.max_seq_len,
                 "cached sequence of {} + {} tokens (model.max_seq_len = {})", s.n_past, s.n_new, cfg_.max_seq_len);
    SLIMPI_CHECK(s.slots.numel() == s.n_past + s.n_new, "sequence has {} slots for {} positions", s.slots.numel(),
                 s.n_past + s.n_new);
    pos.push_back(at::arange(s.n_past, s.n_past + s.n_new, at::TensorOptions().dtype(at::kLong).device(device_)));
    new_lens.push_back(s.n_new);
  }
  CachedKv kv(seqs, cache);
  return forward(tokens, at::cat(pos), new_lens, kv);
}

}  // namespace slimpi
