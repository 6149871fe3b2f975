// Multi-head latent attention (DeepSeek-V3, GLM-4.7-Flash), as transformers'
// DeepseekV3Attention computes it, in the expanded form: per token
//   q     = q_b(norm_qa(q_a(h)))  (q_proj(h) without a query latent)     [H, nope + R]
//   [c|k_r] = kv_a(h);  c ← norm_kv(c)                                   [r], [R] (one rotary key for every head)
//   [k_n|v] = kv_b(c)                                                     [H, nope + Dv]
//   q_r, k_r ← RoPE (interleaved pairs de-interleaved first: the same rotation);
//   score_h = (q_n·k_n + q_r·k_r) · m / √(nope + R);  out = o_proj(softmax · v)
// (m = 1, or YaRN's mscale(factor, mscale_all_dim)², ModelConfig::softmax_scale_factor).
// Each head's dimensions are laid out [rotary | no-rope] here (the order of a dot
// product's terms does not change it), so RoPE is the common one over the first R; the
// values are padded with zeros to nope + R, so that every attention path holds one head
// dimension. That is the trainer's form. The engine (a forward with a KV cache) caches
// the latent instead and attends in the absorbed form: W_UK (kv_b's key rows) folded into
// the query, q_lat = q_n · W_UK_h [r]; one shared "head" [c | k_r] of r + R per token,
// scores q_lat·c + q_r·k_r (the same numbers as q_n·k_n + q_r·k_r, to round-off); the
// weighted sum over the latents, then W_UV_h (kv_b's value rows) per head. That is
// multi-query attention with one key/value head of r + R whose values are its keys (the
// first r columns of the output, the weighted latents, are kept), so the cache holds one
// row of r + R a token and layer (KvCache::values_are_keys) and every cache path takes it
// (paged decode, gathered prefill, prefix cache, preemption, the e4m3 cache and PD
// transfer tested with it). In exact on-policy mode (docs/exact_on_policy.md) the trainer
// attends in the absorbed form too, the engine's, with the per-head products
// batch-invariant (dense), so the two compute a token's scores in one order. Tensor
// parallelism: this shard's H / t heads (the rows of q_b / q_proj and kv_b, the columns
// of o_proj); the latent projections and their norms are whole on every shard, their
// gradients summed over the group (copy_to_tp).
#include <ATen/ATen.h>

#include <cmath>

#include "kernels/batch_invariant.h"
#include "kernels/small_batch_linear.h"
#include "model/forward_context.h"

namespace slimpi {
namespace {

// x [..., R] with rotary pairs (x0, x1), (x2, x3), ... -> [x0, x2, ..., x1, x3, ...]:
// rotate-half RoPE then rotates each pair by its own frequency (transformers'
// apply_rotary_pos_emb_interleave, bit for bit).
at::Tensor deinterleave(const at::Tensor& x) {
  const int64_t R = x.size(-1);
  std::vector<int64_t> pairs = x.sizes().vec();
  pairs.back() = R / 2;
  pairs.push_back(2);
  return x.reshape(pairs).transpose(-1, -2).reshape(x.sizes());
}

// x [T, H, K] · w[h]ᵀ for each head h, w [H, N, K] -> [T, H, N]: one batch-invariant
// product a head under exact numerics (dense), so a row's value does not depend on T.
at::Tensor per_head_product(const at::Tensor& x, const at::Tensor& w) {
  std::vector<at::Tensor> heads;  // [T, N] each
  for (int64_t h = 0; h < w.size(0); ++h) heads.push_back(dense(x.select(1, h), w[h]));
  return at::stack(heads, 1);
}

}  // namespace

at::Tensor Transformer::latent_attention_block(const LayerParams& p, int64_t cache_layer, const at::Tensor& x,
                                               const ForwardContext& f) const {
  const double eps = cfg_.rms_norm_eps;
  const int64_t T = f.n_tokens, H = cfg_.n_heads / tensor_.size, D = cfg_.head_dim(), R = cfg_.qk_rope_head_dim,
                nope = cfg_.qk_nope_head_dim, Dv = cfg_.v_head_dim, r = cfg_.kv_lora_rank;
  auto whole = [&](const at::Tensor& w) { return f.tp ? copy_to_tp(f.tp, w) : w; };  // on every shard
  const at::Tensor h = f.to_columns(rms_norm(x, f.norm_weight(f.shared(p.input_norm)), eps));  // [T, d]
  // The latents' norms use 1e-6 whatever rms_norm_eps says (transformers' and DeepSeek's
  // reference code build them with their class default).
  constexpr double kLatentEps = 1e-6;
  const at::Tensor q_in =
      p.q_a.defined() ? rms_norm(dense(h, whole(p.q_a)), f.as_used(whole(p.q_a_norm)), kLatentEps) : h;
  const at::Tensor q = dense(q_in, p.q).view({T, H, D});                                   // [T, H, nope + R]
  const at::Tensor kv_a = dense(h, whole(p.kv_a));                                          // [T, r + R]
  const at::Tensor latent = rms_norm(kv_a.narrow(-1, 0, r), f.as_used(whole(p.kv_a_norm)), kLatentEps);  // [T, r]
  at::Tensor q_rot = q.narrow(-1, nope, R), k_rot = kv_a.narrow(-1, r, R).unsqueeze(1);     // [T, H, R], [T, 1, R]
  if (cfg_.rope_interleave) {
    q_rot = deinterleave(q_rot);
    k_rot = deinterleave(k_rot);
  }
  q_rot = apply_rope(q_rot, f.cos, f.sin);
  k_rot = apply_rope(k_rot, f.cos, f.sin);
  // (kv_b applies after attention there: no per-head keys and values here.) Exact numerics:
  // the trainer's forward too, as the engine computes.
  if (latent_cache_ && (f.cache || exact_numerics()))
    return absorbed_attention(p, cache_layer, q.narrow(-1, 0, nope), q_rot, latent, k_rot, f);
  const at::Tensor kv = dense(latent, p.kv_b).view({T, H, nope + Dv});                      // [T, H, nope + Dv]
  at::Tensor qh = at::cat({q_rot, q.narrow(-1, 0, nope)}, -1);                         // [T, H, D]
  if (const double m = cfg_.softmax_scale_factor(); m != 1.0) qh = qh * m;  // YaRN's mscale², in the scores
  const at::Tensor kh = at::cat({k_rot.expand({T, H, R}), kv.narrow(-1, 0, nope)}, -1);  // [T, H, D]
  const at::Tensor v = at::constant_pad_nd(kv.narrow(-1, nope, Dv), {0, D - Dv});        // [T, H, D]
  const at::Tensor attn = attend_heads(qh, kh, v, cache_layer, f).view({T, H, D}).narrow(-1, 0, Dv);
  return output_projection(p, attn.reshape({T, H * Dv}), f);
}

at::Tensor Transformer::absorbed_attention(const LayerParams& p, int64_t cache_layer, const at::Tensor& q_nope,
                                           const at::Tensor& q_rot, const at::Tensor& latent, const at::Tensor& k_rot,
                                           const ForwardContext& f) const {
  const int64_t T = f.n_tokens, H = cfg_.n_heads / tensor_.size, R = cfg_.qk_rope_head_dim,
                nope = cfg_.qk_nope_head_dim, Dv = cfg_.v_head_dim, r = cfg_.kv_lora_rank;
  const at::Tensor w = p.kv_b.view({H, nope + Dv, r});
  const at::Tensor w_uk = w.narrow(1, 0, nope), w_uv = w.narrow(1, nope, Dv);       // [H, nope, r], [H, Dv, r]
  const bool exact = exact_numerics();
  const at::Tensor q_latent = exact ? per_head_product(q_nope, w_uk.transpose(1, 2))  // [T, H, r]
                                    : at::einsum("thn,hnr->thr", {q_nope, w_uk});
  // attend() divides by √(r + R); the scores are divided by √(nope + R) (times YaRN's m).
  const double scale = std::sqrt(double(r + R) / double(cfg_.head_dim())) * cfg_.softmax_scale_factor();
  const at::Tensor qa = at::cat({q_latent, q_rot.to(q_latent.scalar_type())}, -1) * scale;  // [T, H, r + R]
  const at::Tensor ka = at::cat({latent, k_rot.squeeze(1).to(latent.scalar_type())}, -1).unsqueeze(1);  // [T, 1, r + R]
  // The values are the keys (the cache holds one row: KvCache::values_are_keys): the
  // weighted sum's first r columns are the weighted latents; its last R (over the rotary
  // keys) are dropped.
  const at::Tensor o_latent = attend_heads(qa, ka, ka, cache_layer, f).view({T, H, r + R}).narrow(-1, 0, r);
  const at::Tensor attn = exact ? per_head_product(o_latent, w_uv)  // [T, H, Dv]
                                : at::einsum("thr,hvr->thv", {o_latent, w_uv});
  return output_projection(p, attn.reshape({T, H * Dv}), f);
}

}  // namespace slimpi
