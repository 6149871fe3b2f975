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
// values are padded with zeros to nope + R, so that every attention path and the KV cache
// hold one head dimension (the cache holds expanded keys and values: the latent cache and
// the absorbed decode of issue 48 are not here yet). Tensor parallelism: this shard's
// H / t heads (the rows of q_b / q_proj and kv_b, the columns of o_proj); the latent
// projections and their norms are whole on every shard, their gradients summed over the
// group (copy_to_tp).
#include <ATen/ATen.h>

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

}  // namespace

at::Tensor Transformer::latent_attention_block(const LayerParams& p, int64_t cache_layer, const at::Tensor& x,
                                               const ForwardContext& f) const {
  const double eps = cfg_.rms_norm_eps;
  const int64_t T = f.n_tokens, H = cfg_.n_heads / tensor_.size, D = cfg_.head_dim(), R = cfg_.qk_rope_head_dim,
                nope = cfg_.qk_nope_head_dim, Dv = cfg_.v_head_dim, r = cfg_.kv_lora_rank;
  auto whole = [&](const at::Tensor& w) { return f.tp ? copy_to_tp(f.tp, w) : w; };  // on every shard
  const at::Tensor h = f.to_columns(rms_norm(x, f.as_used(f.shared(p.input_norm)), eps));  // [T, d]
  const at::Tensor q_in = p.q_a.defined() ? rms_norm(dense(h, whole(p.q_a)), f.as_used(whole(p.q_a_norm)), eps) : h;
  const at::Tensor q = dense(q_in, p.q).view({T, H, D});                                   // [T, H, nope + R]
  const at::Tensor kv_a = dense(h, whole(p.kv_a));                                          // [T, r + R]
  const at::Tensor latent = rms_norm(kv_a.narrow(-1, 0, r), f.as_used(whole(p.kv_a_norm)), eps);  // [T, r]
  const at::Tensor kv = dense(latent, p.kv_b).view({T, H, nope + Dv});                      // [T, H, nope + Dv]
  at::Tensor q_rot = q.narrow(-1, nope, R), k_rot = kv_a.narrow(-1, r, R).unsqueeze(1);     // [T, H, R], [T, 1, R]
  if (cfg_.rope_interleave) {
    q_rot = deinterleave(q_rot);
    k_rot = deinterleave(k_rot);
  }
  q_rot = apply_rope(q_rot, f.cos, f.sin);
  k_rot = apply_rope(k_rot, f.cos, f.sin);
  at::Tensor qh = at::cat({q_rot, q.narrow(-1, 0, nope)}, -1);                         // [T, H, D]
  if (const double m = cfg_.softmax_scale_factor(); m != 1.0) qh = qh * m;  // YaRN's mscale², in the scores
  const at::Tensor kh = at::cat({k_rot.expand({T, H, R}), kv.narrow(-1, 0, nope)}, -1);  // [T, H, D]
  const at::Tensor v = at::constant_pad_nd(kv.narrow(-1, nope, Dv), {0, D - Dv});        // [T, H, D]
  const at::Tensor attn = attend_heads(qh, kh, v, cache_layer, f).view({T, H, D}).narrow(-1, 0, Dv);
  return output_projection(p, attn.reshape({T, H * Dv}), f);
}

}  // namespace slimpi
