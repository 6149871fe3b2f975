// Batch-invariant host kernels: the operations of a forward whose value for one row
// (a token, a query, a logits row) is a fixed sequence of IEEE operations on that row's
// inputs alone, whatever rows share the call, however many there are, wherever chunk
// or thread boundaries fall. They are what exact on-policy mode (train.on_policy =
// "exact", docs/exact_on_policy.md) computes the trainer's forward and the engine's
// with, so that a token's log-prob is the same bits in both. ATen's own kernels are not:
// a reduction over a row may be split across threads when rows are few, and its
// element-wise loops take a scalar path (std::exp) for a thread chunk's tail and a
// vector path (Sleef) elsewhere, with chunk bounds that move with the tensor's size.
//
// How each fixes its order (all fp32 in and out; this file is compiled with
// -ffp-contract=off, so no product is fused into an add and the vector and scalar code
// of one loop round alike):
//   sums over a row      16 lane sums (element i into lane i mod 16), in index order,
//                        then the lanes added in one fixed tree
//   exp                  exp_fixed below (Cody-Waite reduction and Cephes' degree-6
//                        polynomial): plain arithmetic, the same bits vectorised or not
//   threads              split rows only, never a row's reduction
// The matrix product is small_batch_linear's (kernels/small_batch_linear.h), already a
// fixed order per output for any row count.
#pragma once

#include <ATen/core/Tensor.h>

namespace slimpi {

// Every kernel here: inputs on the CPU, fp32, any strides (made contiguous); outputs
// fresh contiguous fp32.

// x [R, n], w [n] -> y[r, i] = (x[r, i] · ρ_r) · w[i], ρ_r = 1 / sqrt(Σ_i x[r, i]² / n + eps)
// (the sum of squares in fp64 lanes; ρ_r rounded to fp32 once). model/forward_context.h's
// rms_norm formula.
at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& w, double eps);

// Element-wise, any shape: silu(g) · u = (g / (1 + exp(−g))) · u, and sigmoid(x) = 1 / (1 + exp(−x)).
at::Tensor silu_mul_elementwise(const at::Tensor& g, const at::Tensor& u);
at::Tensor sigmoid_elementwise(const at::Tensor& x);

// silu(x) = x / (1 + exp(−x)), element-wise; softplus(x) = log(1 + exp(x)) (x for x > 20,
// torch's threshold; libm's log1p and exp in fp64, rounded once).
at::Tensor silu_elementwise(const at::Tensor& x);
at::Tensor softplus_elementwise(const at::Tensor& x);

// x [R, n] -> y[r, i] = x[r, i] · ρ_r, ρ_r = 1 / sqrt(Σ_i x[r, i]² + eps) (the sum in fp64
// lanes, ρ_r rounded to fp32 once): the l2 normalisation of Gated DeltaNet's q and k.
at::Tensor l2_normalize_rows(const at::Tensor& x, double eps);

// The gated delta rule (model/gated_delta_rule.h) token by token, per sequence b and
// head h on its own (threads split the (b, h) pairs), from S = initial_state[b, h]:
//   S ← S · exp_fixed(g_t);  u = (v_t − Σ_i k_t[i] S[i, :]) · β_t;  S ← S + k_t uᵀ;
//   o_t = Σ_i q_t[i] S[i, :]
// each sum over i in order. A token's output and the state after it depend on the
// sequence's tokens up to it only, so prefill in any chunks followed by decode steps
// gives the bits of one pass. q, k [B, L, H, Dk], v [B, L, H, Dv], g, beta [B, L, H]
// fp32, initial_state [B, H, Dk, Dv] (undefined: zeros) -> o [B, L, H, Dv];
// *final_state the state after position L − 1.
at::Tensor gated_delta_rule_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                 const at::Tensor& beta, const at::Tensor& initial_state, at::Tensor* final_state);

// x [R, n] -> softmax over each row: exp(x − max) / Σ exp(x − max) (the sum in fp64 lanes).
at::Tensor softmax_rows(const at::Tensor& x);

// x [R, k] (k small: an MoE router's chosen scores) -> x[r, j] / (Σ_j x[r, j] + eps), the
// sum in index order.
at::Tensor normalize_rows(const at::Tensor& x, double eps);

// Log-probs of sampled tokens, the one definition of exact mode (model/log_probs.h's
// formula, with its order fixed): for row r, z_j = logits[r, j] / temperature[r] (an fp32
// division), m = max z, and over the support (the whole row, or for support[r] = k > 0
// the k largest z, taken in descending order)
//   logp[r] = float((double(z_t) − m) − log Σ exp_fixed(z_j − m))
// with the sum in fp64 lanes. logits [N, V] fp32, temperature [N] fp32 (> 0), targets [N]
// int64, support [N] int64 (undefined: all 0) -> [N] fp32. Columns at −inf contribute 0.
at::Tensor token_log_probs_rows(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& targets,
                                const at::Tensor& support);

// Causal attention, one query row at a time. Row r belongs to sequence seq_of_row[r] and
// sees that sequence's first n_keys[r] keys, which lie at slots key_slots[seq, 0 ..
// n_keys[r]) of K and V (a paged cache's slots, or a packed batch's own rows). Per head h
// (kv head h / (H / Hkv)):
//   s_t = Σ_d (q_h[d] · (1/sqrt(D))) · K_t[d]   (summed over d in order)
//   p_t = exp_fixed(s_t − max s),  S = Σ_t p_t (fp64, in key order)
//   out = (Σ_t p_t V_t) · float(1 / S)   (fp32, in tiles of 64 keys, each tile's sum
//                                           added to the total in key order)
// q [R, H, D] fp32, K/V [n_slots, Hkv, D] fp32, bf16 or e4m3 (a cache's storage, read as
// its fp32 values: e4m3 codes times k_scale / v_scale [Hkv] fp32), key_slots [B, max_keys]
// int64, seq_of_row [R] int64, n_keys [R] int64 -> [R, H, D].
at::Tensor attention_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_slots,
                          const at::Tensor& seq_of_row, const at::Tensor& n_keys, const at::Tensor& k_scale = {},
                          const at::Tensor& v_scale = {});

// The process-wide switch (set once at start-up from the deck, on every rank, before a
// model computes): while on, the model's forwards and the log-probs of sampled tokens
// run the kernels above and small_batch_linear for every product, in training and in
// the engine alike (model/exact_ops.h says where).
void set_exact_numerics(bool on);
bool exact_numerics();

// The storage of the engines' key/value cache (rollout.kv_cache_dtype: fp32, bf16 or
// e4m3), set with the switch: under exact numerics the trainer's attention reads its keys
// and values as that cache holds them (model/kv_cache.h kv_storage_values). fp32 unless set.
void set_exact_kv_storage(at::ScalarType storage);
at::ScalarType exact_kv_storage();

// The code level the kernels run on this CPU: 4 (x86-64-v4), 3 (-v3) or 1 (plain x86-64,
// whose products round apart from the fused multiply-adds of the others). Ranks that
// compare log-probs must run one level (driver/run_context.cpp checks it).
int exact_kernel_level();

}  // namespace slimpi
