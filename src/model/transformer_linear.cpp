// Gated DeltaNet: the token mixer of a hybrid model's linear layers (Qwen3.5, Qwen3-Next),
// as transformers' Qwen3_5GatedDeltaNet computes it. For the tokens of one sequence, with
// h the input norm's output [T, d]:
//   [q; k; v] = silu(causal depthwise conv1d_K(h · W_qkv^T))   q, k [T, Hk, Dk], v [T, Hv, Dv]
//   q <- l2norm(q) / sqrt(Dk),  k <- l2norm(k)                  (each key head shared by Hv / Hk
//                                                               consecutive value heads)
//   beta = sigmoid(h · W_b^T),  g = -exp(A_log) · softplus(h · W_a^T + dt_bias)      [T, Hv]
//   o = the gated delta rule over (q, k, v, g, beta)            (model/gated_delta_rule.h)
//   out = (rmsnorm_Dv(o) · w_norm · silu(h · W_z^T)) · W_out^T
// The q/k/v channels are held grouped by key head (model/linear_channels.h). Under tensor
// parallelism t each rank runs its Hk / t key heads and the Hv / t value heads that read
// them, whole (column-parallel projections, convolution, rule and gated norm; row-parallel
// out_proj, summed over the group as attention's o_proj is).
// The convolution sees only its own sequence's past: zeros before position 0, and in an
// incremental forward the last K - 1 inputs before the new tokens (the cache's conv state).
// The projections and out_proj run in the forward's precision (a bf16 forward rounds them,
// and the weights, to bf16); the convolution, the rule, its state and the gated norm run in
// fp32 whatever it is.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <slimpi/error.h>

#include <cmath>
#include <optional>

#include "kernels/batch_invariant.h"
#include "kernels/small_batch_linear.h"
#include "model/forward_context.h"
#include "model/gated_delta_rule.h"
#include "model/tensor_shard.h"

namespace slimpi {
namespace {

// The projections of h [T, d] for this rank's heads (Hk, Hv: the local counts): q/k/v
// channels [T, Hk·(2·Dk + r·Dv)] grouped by key head (per key head i: q_i, k_i, then the
// values of its r = Hv/Hk value heads), z [T, Hv·Dv], b and a [T, Hv], from Qwen3.5's four
// matrices or Qwen3-Next's two fused ones (per key head i: q_i, k_i, the values and z rows
// of its value heads; b then a rows of those heads).
struct Projections {
  at::Tensor qkv, z, b, a;
};
Projections project(const at::Tensor& h, const Transformer::LayerParams& p, const ModelConfig& c, int64_t Hk) {
  if (!c.linear_fused_projections)
    return {dense(h, p.lin_qkv).to(at::kFloat), dense(h, p.lin_z).to(at::kFloat), dense(h, p.lin_b).to(at::kFloat),
            dense(h, p.lin_a).to(at::kFloat)};
  const int64_t T = h.size(0), Dk = c.linear_key_head_dim;
  const int64_t r = c.linear_num_value_heads / c.linear_num_key_heads, Dv = c.linear_value_head_dim;
  const at::Tensor qkvz = dense(h, p.lin_qkv).to(at::kFloat).view({T, Hk, 2 * Dk + 2 * r * Dv});
  const at::Tensor ba = dense(h, p.lin_b).to(at::kFloat).view({T, Hk, 2 * r});
  auto heads = [&](const at::Tensor& x, int64_t from, int64_t n) { return x.narrow(-1, from, n).reshape({T, -1}); };
  return {heads(qkvz, 0, 2 * Dk + r * Dv), heads(qkvz, 2 * Dk + r * Dv, r * Dv), heads(ba, 0, r), heads(ba, r, r)};
}

// x [..., D] -> x / sqrt(sum x^2 + 1e-6) (the FLA library's l2norm, as transformers uses it).
at::Tensor l2_normalized(const at::Tensor& x) { return l2_normalize_last(x, 1e-6); }

// The depthwise causal convolution, silu'd: joined [B, C, K - 1 + L] (each sequence's
// K - 1 inputs before the new ones first), taps [C, K] -> [B, C, L]. Under exact numerics
// each output is Σ_k taps[c, k] · joined[b, c, l + k] added in k order, one exactly
// rounded multiply and add at a time (ATen's element-wise ops), which no batch shape
// changes; conv1d's algorithm is chosen by the shape.
at::Tensor causal_conv_silu(const at::Tensor& joined, const at::Tensor& taps, int64_t L) {
  const int64_t C = taps.size(0), K = taps.size(1);
  if (!exact_numerics())
    return at::silu(at::conv1d(joined, taps.unsqueeze(1), at::Tensor(), at::IntArrayRef{1}, at::IntArrayRef{0},
                               at::IntArrayRef{1}, C));
  at::Tensor sum = joined.narrow(2, 0, L) * taps.narrow(1, 0, 1);  // [B, C, L]
  for (int64_t k = 1; k < K; ++k) sum = sum + joined.narrow(2, k, L) * taps.narrow(1, k, 1);
  return silu_of(sum);
}

// rows [T, X] -> [B, L, X], token t at (b_of_t[t], j_of_t[t]), zeros elsewhere.
at::Tensor padded(const at::Tensor& rows, const AttentionLayout& a) {
  return at::zeros({a.n_seqs, a.max_new, rows.size(1)}, rows.options()).index_put({a.b_of_t, a.j_of_t}, rows);
}

}  // namespace

at::Tensor Transformer::linear_attention_block(const LayerParams& p, const at::Tensor& x,
                                               const ForwardContext& f) const {
  const at::Tensor h = f.to_columns(rms_norm(x, f.norm_weight(f.shared(p.input_norm)), cfg_.rms_norm_eps));  // [T, d]
  // The gated norm's weight is shared by every rank's value heads: copy_to_tp sums its gradient.
  const at::Tensor norm = copy_to_tp(f.tp, p.lin_norm);
  const LinearHeads local = local_linear_heads(cfg_, tensor_.size);  // this rank's heads and channels
  const int64_t width = local.value_heads * cfg_.linear_value_head_dim;
  // h [T_l, d] over layout a -> the gated norm's output [T_l, Hv·Dv] (this rank's value heads), fp32.
  auto mix = [&](const at::Tensor& h, const AttentionLayout& a) {
    // Packed sequences are padded to the longest; past the padded budget (in elements of
    // the q/k/v channels, as attention's is in scores) each sequence runs alone instead.
    if (!f.cache && a.n_seqs > 1 && a.n_seqs * a.max_new * local.conv_dim > padded_attention_budget_) {
      std::vector<at::Tensor> outs;
      int64_t start = 0;
      for (int64_t n : a.seq_lens) {
        outs.push_back(linear_attention(p, norm, h.narrow(0, start, n), packed_layout({n}, h.device()), nullptr));
        start += n;
      }
      return at::cat(outs);
    }
    if (a.parts.empty()) return linear_attention(p, norm, h, a, f.cache);
    // Decode rows and prefill chunks apart: the decode rows take the recurrent step, unpadded.
    at::Tensor gated = at::empty({h.size(0), width}, h.options().dtype(at::kFloat));
    for (const auto& part : a.parts)
      gated.index_copy_(0, part.token_index,
                        linear_attention(p, norm, h.index_select(0, part.token_index), part.layout, f.cache));
    return gated;
  };
  at::Tensor gated;  // [T, Hv·Dv] (this rank's value heads), fp32
  if (const ContextSplit* split = f.layout.context.get()) {
    // Context parallelism: the recurrence runs through every chunk of a sequence in order,
    // so each rank runs the block over the group's whole batch (its input gathered) and
    // keeps its own rows; the gather's backward sums every rank's gradient of its rows.
    gated = mix(split->gather_rows(h), packed_layout(split->seq_lens(), h.device())).index_select(0, split->local_rows());
  } else {
    gated = mix(h, f.layout);
  }
  // out_proj in the forward's precision: row-parallel under tensor parallelism.
  if (f.tp) return f.from_rows(dense(gated, p.lin_out));  // [T_local, d]
  return dense(gated, p.lin_out).to(at::kFloat);          // [T, d]
}

at::Tensor Transformer::linear_attention(const LayerParams& p, const at::Tensor& norm, const at::Tensor& h,
                                         const AttentionLayout& a, KvCache* cache) const {
  const int64_t T = h.size(0), B = a.n_seqs, L = a.max_new;
  const auto [Hk, Hv, C] = local_linear_heads(cfg_, tensor_.size);  // this rank's heads and channels
  const int64_t Dk = cfg_.linear_key_head_dim, Dv = cfg_.linear_value_head_dim, r = Hv / Hk;
  const int64_t K = cfg_.linear_conv_kernel_dim, past_len = K - 1;
  const bool bf16 = at::autocast::is_autocast_enabled(h.device().type()) &&
                    at::autocast::get_autocast_dtype(h.device().type()) == at::kBFloat16;
  auto as_used = [&](const at::Tensor& w) { return (bf16 ? w.to(at::kBFloat16) : w).to(at::kFloat); };
  const int64_t li = p.linear_index;
  // Each sequence's state slot; a sequence without past starts from zeros.
  at::Tensor slots, no_past;  // [B] int64, [B] bool
  if (cache) {
    SLIMPI_CHECK(int64_t(a.state_slots.size()) == B && li < int64_t(cache->conv_state.size()),
                 "Gated DeltaNet layer {}: an incremental forward needs every sequence's state slot ({} of {} given; "
                 "the cache holds {} linear layers)", li, a.state_slots.size(), B, cache->conv_state.size());
    for (int64_t s : a.state_slots)
      SLIMPI_CHECK(s >= 0 && s < cache->n_state_slots(), "state slot {} outside the cache's {}", s,
                   cache->n_state_slots());
    slots = at::tensor(a.state_slots, at::kLong).to(h.device());
    std::vector<uint8_t> fresh;
    for (int64_t n : a.n_past_host) fresh.push_back(n == 0);
    no_past = at::tensor(fresh, at::kByte).to(at::kBool).to(h.device());
  }

  const Projections proj = project(h, p, cfg_, Hk);  // (rounded to bf16 by a bf16 forward's autocast)
  // From here to the gated norm everything runs in fp32, the bf16 forward's too (autocast
  // would run the convolution and the rule's products in bf16 and round the state).
  std::optional<c10::impl::ExcludeDispatchKeyGuard> fp32;
  if (bf16) fp32.emplace(c10::autocast_dispatch_keyset);
  // The convolution over each sequence's q/k/v channels, its K - 1 inputs before the new ones first.
  const at::Tensor& mixed = proj.qkv;                                    // [T, C]
  const at::Tensor fresh_in = padded(mixed, a).transpose(1, 2);         // [B, C, L]
  at::Tensor past = at::zeros({B, C, past_len}, fresh_in.options());    // [B, C, K - 1]
  if (cache) past = cache->conv_state[size_t(li)].index_select(0, slots).masked_fill(no_past.view({B, 1, 1}), 0.0);
  const at::Tensor joined = at::cat({past, fresh_in}, 2);              // [B, C, K - 1 + L]
  const at::Tensor conv = causal_conv_silu(joined, as_used(p.lin_conv), L);  // [B, C, L] (depthwise: [C, K] taps)
  if (cache) {  // the new conv state: the last K - 1 inputs of each sequence, n_new[b] .. n_new[b] + K - 2 of `joined`
    std::vector<int64_t> last;
    for (int64_t n : a.n_new_host)
      for (int64_t i = 0; i < past_len; ++i) last.push_back(n + i);
    const at::Tensor index = at::tensor(last, at::kLong).to(h.device()).view({B, 1, past_len}).expand({B, C, past_len});
    cache->conv_state[size_t(li)].index_copy_(0, slots, joined.gather(2, index));
  }
  const at::Tensor y = conv.transpose(1, 2).reshape({B, L, Hk, 2 * Dk + r * Dv});  // each key head's channels
  at::Tensor q = l2_normalized(y.narrow(-1, 0, Dk)) / std::sqrt(double(Dk));       // [B, L, Hk, Dk]
  at::Tensor k = l2_normalized(y.narrow(-1, Dk, Dk));                              // [B, L, Hk, Dk]
  const at::Tensor v = y.narrow(-1, 2 * Dk, r * Dv).reshape({B, L, Hv, Dv});       // [B, L, Hv, Dv]
  if (r > 1) {  // value head j reads key head j / r
    q = q.repeat_interleave(r, 2);
    k = k.repeat_interleave(r, 2);
  }
  // Write strength and log decay, zero past each sequence's end (the state passes them unchanged).
  const at::Tensor beta = padded(sigmoid_of(proj.b), a);                                      // [B, L, Hv]
  const at::Tensor decay_rate = as_used(p.lin_a_log).exp();                                   // [Hv]
  const at::Tensor g = padded(-decay_rate * softplus_of(proj.a + as_used(p.lin_dt_bias)), a);  // [B, L, Hv]
  at::Tensor state;  // [B, Hv, Dk, Dv]
  if (cache) state = cache->delta_state[size_t(li)].index_select(0, slots).masked_fill(no_past.view({B, 1, 1, 1}), 0.0);
  at::Tensor final_state;
  // (decode steps recurrent, the rest chunked; token by token under exact numerics)
  const at::Tensor o = gated_delta_rule(q, k, v, g, beta, state, cache ? &final_state : nullptr, cache && L == 1);
  if (cache) cache->delta_state[size_t(li)].index_copy_(0, slots, final_state);
  // The gated RMSNorm over each value head.
  const at::Tensor rows = o.index({a.b_of_t, a.j_of_t});                                     // [T, Hv, Dv]
  const at::Tensor z = proj.z.view({T, Hv, Dv});                                            // [T, Hv, Dv]
  const at::Tensor normed = rms_norm(rows, as_used(norm), cfg_.rms_norm_eps);                // [T, Hv, Dv]
  return (normed * silu_of(z)).view({T, Hv * Dv});                                          // [T, Hv * Dv] fp32
}

}  // namespace slimpi
