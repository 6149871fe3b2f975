// Decode attention read straight from a paged KV cache, on the host: what the paged-
// attention kernels of vLLM and SGLang do for the one new token of each running sequence.
//
// Sequence b has one query (all H heads) at position n_keys[b] - 1 and attends to its
// keys 0..n_keys[b]-1, whose K and V rows lie in the cache at slots key_slots[b, t] (the
// engine's block table expanded: slot = block * block_size + offset, blocks anywhere in
// the pool). For each (sequence, kv head) and the g = H / Hkv query heads sharing that kv
// head (grouped-query attention):
//   s_t = q · K[slot_t] / sqrt(D)      t < n_keys[b]
//   p   = softmax(s)                   (max-subtracted, fp32)
//   out = Σ_t p_t V[slot_t]
// Two passes over the keys (the scores into a per-thread row that is reused, then the
// weighted sum of V), each K and V row read once where it lies: no copy of the history,
// no padding to the longest sequence. fp32 arithmetic; the softmax denominator sums in
// fp64 and Σ p V in tiles of 64 keys, so round-off stays flat at 4096-key contexts
// (engine vs trainer log-probs 2.9e-6 there, tests/unit/rollout). The cache may hold
// fp32, bf16 or float8_e4m3fn with per-kv-head scales (k_scale, v_scale [Hkv] fp32: a
// row's head h reads as its e4m3 values times scale[h]). Sequences run in parallel on torch's thread pool (one sequence, all its
// heads, per task).
// The engine's CPU decode path; a device cache gathers into a reused buffer instead
// (model/transformer.cpp). Tested against dense attention over the gathered keys.
#pragma once

#include <ATen/core/Tensor.h>

namespace slimpi {

// q [B, H, D] (fp32 or bf16), cache_k/cache_v [n_slots, Hkv, D] (fp32, bf16 or e4m3, one
// dtype), key_slots [B, max_keys] int64 (entries past n_keys[b] are not read), n_keys [B]
// int64, k_scale/v_scale [Hkv] fp32 (e4m3 caches only), all on the CPU -> [B, H, D] in q's dtype.
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& cache_k, const at::Tensor& cache_v,
                                  const at::Tensor& key_slots, const at::Tensor& n_keys,
                                  const at::Tensor& k_scale = {}, const at::Tensor& v_scale = {});

}  // namespace slimpi
