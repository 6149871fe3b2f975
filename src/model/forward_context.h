// Transformer::ForwardContext — what every layer of one forward shares (the layout,
// the cache, parallelism, precision, RoPE at each position) — and the two numeric
// helpers every attention form uses (RMSNorm, RoPE). Internal to src/model/: included by
// transformer.cpp and the attention forms in files of their own (transformer_mla.cpp).
// A ForwardContext lives for one forward (or, kept by activation recomputation, until
// its backward).
#pragma once

#include <ATen/ATen.h>

#include <memory>

#include "model/exact_ops.h"
#include "model/transformer.h"
#include "parallel/tp_mappings.h"

namespace slimpi {


// RoPE, Hugging Face's rotate-half layout over the first R dimensions of each head (R =
// D unless partial_rotary_factor < 1; the rest pass): x_r * cos + rotate_half(x_r) * sin.
// x [T, heads, D], cos/sin [T, 1, R].
inline at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t R = cos.size(-1), half = R / 2;
  const at::Tensor xr = R == x.size(-1) ? x : x.narrow(-1, 0, R);
  at::Tensor rotated = at::cat({-xr.narrow(-1, half, half), xr.narrow(-1, 0, half)}, -1);
  const at::Tensor out = xr * cos + rotated * sin;
  return R == x.size(-1) ? out : at::cat({out, x.narrow(-1, R, x.size(-1) - R)}, -1);
}

// What every layer of one forward shares.
struct Transformer::ForwardContext {
  const AttentionLayout& layout;
  KvCache* cache;
  AttentionPlan plan;
  at::Tensor cos, sin;  // [T, 1, R] RoPE at every token's position (R = the rotary dimensions)
  // In a bf16 forward every weight is used as its bf16 rounding, as autocast does for
  // the matrix products: the embedding and the norm weights too, so fp32 masters
  // (training) and bf16 weights (a bf16 engine) compute the same thing.
  bool bf16 = false;
  at::Tensor as_used(const at::Tensor& w) const { return bf16 ? w.to(at::kBFloat16) : w; }
  // An RMSNorm weight as applied: w, or 1 + w for a zero-centred norm (ModelConfig::
  // zero_centered_norm; in fp32, from w's rounding).
  bool zero_centered = false;
  at::Tensor norm_weight(const at::Tensor& w) const { return zero_centered ? as_used(w).to(at::kFloat) + 1.0 : as_used(w); }
  // Tensor parallelism (null: none) and sequence parallelism: the residual stream then
  // holds rows [r·T_pad/t, (r+1)·T_pad/t) of the T tokens padded to T_pad (a multiple of t).
  Comm* tp = nullptr;
  bool sp = false;
  int64_t n_tokens = 0, n_padded = 0;
  Recompute recompute = Recompute::None;  // what this forward recomputes in backward (training only)
  std::shared_ptr<const AttentionLayout> kept_layout = nullptr;  // with recompute: `layout`, kept for backward
  // A replicated weight applied to this rank's rows: under sequence parallelism each
  // rank's gradient is a part, which copy_to_tp sums over the group.
  at::Tensor shared(const at::Tensor& w) const { return sp ? copy_to_tp(tp, w) : w; }
  // A replicated key/value head's weight (t > Hkv): its gradient summed over the replicas.
  Comm* kv_replicas = nullptr;
  at::Tensor kv_shared(const at::Tensor& w) const { return kv_replicas ? copy_to_tp(kv_replicas, w) : w; }
  // The column-parallel side of a layer: this rank's rows [T_local, d] -> every token's
  // [T, d] (copy_to_tp, or gathered over the sequence).
  at::Tensor to_columns(const at::Tensor& h) const {
    if (!sp) return copy_to_tp(tp, h);
    return gather_from_sequence(tp, h).narrow(0, 0, n_tokens);
  }
  // The row-parallel side: partial sums [T, d] -> this rank's rows of their sum.
  at::Tensor from_rows(const at::Tensor& partial) const {
    if (!sp) return reduce_from_tp(tp, partial);
    return reduce_scatter_to_sequence(tp, padded(partial));
  }
  // A block every rank runs whole (MoE layers): this rank's rows -> every token's, each
  // rank's gradient its own rows; and back, each rank keeping its rows.
  at::Tensor whole_rows(const at::Tensor& h) const {
    return sp ? gather_from_sequence_for_replicated(tp, h).narrow(0, 0, n_tokens) : h;
  }
  at::Tensor own_rows(const at::Tensor& y) const { return sp ? scatter_to_sequence(tp, padded(y)) : y; }
  at::Tensor padded(const at::Tensor& rows) const {
    return n_padded == n_tokens ? rows : at::constant_pad_nd(rows, {0, 0, 0, n_padded - n_tokens});
  }
};

}  // namespace slimpi
