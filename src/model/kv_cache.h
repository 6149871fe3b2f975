// KvCache — keys and values of every layer of the rollout engine's sequences,
// addressed by slot (a slot holds one token's K and V for all KV heads). Slot
// assignment (contiguous per sequence, or paged blocks: rollout/block_allocator.h) is
// the caller's business. Owned by the engine; Transformer::forward_incremental writes
// the new tokens' keys and values at their slots and reads every past one from here.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "model/model_config.h"

namespace slimpi {

//
// Storage dtype (rollout.kv_cache_dtype): the engine's compute dtype (fp32, bf16), bf16
// under an fp32 engine, or float8_e4m3fn: then k holds e4m3(clamp(K / k_scale[h], ±448))
// and reads multiply back by the head's scale (v likewise). Scale policy: fixed, one
// per layer and kv head, 1.0 (SGLang's and vLLM's default for a checkpoint without
// calibrated scales; K and V of more than 448 in magnitude saturate). Writes go through
// store(), reads through decoded() or the paged kernel (given the scales).
// An e4m3 cache's scale, every layer and kv head (the fixed policy above).
inline constexpr float kKvCacheScale = 1.0f;

// What a cache stored as `storage` (fp32, bf16 or e4m3) gives back for rows x [n, Hkv, D]:
// the fp32 values the engine's attention reads (exact on-policy: the trainer's attention
// reads its keys and values as the engine's cache holds them, model/attention.cpp).
at::Tensor kv_storage_values(const at::Tensor& x, at::ScalarType storage);

struct KvCache {
  // (t: the engine's tensor-parallel size; Hkv_local = Hkv / t, or 1 when t > Hkv replicates the heads;
  // multi-head latent attention: Hkv_local = 1, D = its latent's width: model/tensor_shard.h, kv_cache_row)
  std::vector<at::Tensor> k;  // n_layers (+ MTP depths) x [n_slots, Hkv_local, D]
  std::vector<at::Tensor> v;  // n_layers x [n_slots, Hkv_local, D]
  std::vector<at::Tensor> k_scale, v_scale;  // e4m3 caches: n_layers x [Hkv_local] fp32; else empty
  // Multi-head latent attention's latent cache: v[l] is k[l] (the same tensor, and
  // v_scale k_scale): the values are the latent, the keys' first kv_lora_rank columns, and
  // the absorbed attention keeps only those columns of its output. store() writes the keys
  // alone; the block copies and KV transfers move them once.
  bool values_are_keys = false;
  // Gathered keys/values of the sequences one attention call reads (the Gather decode
  // path, and prefill chunks with a cached past): [rows, n_kv_heads, D] each, re-used by
  // every layer and step, grown only when a call needs more rows.
  at::Tensor gathered_k, gathered_v;
  // Mixture-of-experts policies: the experts each slot's token ran, kept with its K/V so
  // that tokens served from the prefix cache still have their routing trace.
  at::Tensor routing;  // [n_slots, n_moe_layers, k] int16 (undefined for dense models)
  // Hybrid linear-attention models (ModelConfig::is_hybrid): each sequence's Gated DeltaNet
  // state lives in a state slot of its own (the engine gives one to every running
  // sequence), per linear layer i (the i-th such layer of the model): the convolution's
  // last K - 1 inputs and the delta rule's recurrent state, both fp32. A sequence's state
  // is its whole past, so it is only right for the positions its sequence computed; a
  // forward over a sequence with no past (n_past = 0) starts from zeros whatever the slot
  // holds. The full-attention layers keep their K/V rows above; a linear layer's are
  // empty ([n_slots, 0, D]).
  std::vector<at::Tensor> conv_state;   // n_linear_layers x [n_state_slots, C_local, K - 1] (this rank's channels)
  std::vector<at::Tensor> delta_state;  // n_linear_layers x [n_state_slots, Hv_local, Dk, Dv] (this rank's value heads)
  // tensor_parallel: the engine's group size; each rank caches its Hkv_local heads
  // (model/tensor_shard.h, local_kv_heads). mtp_layers: layers n_layers .. n_layers +
  // mtp_layers - 1 too, the first MTP depths' (a speculating engine's draft).
  // latent: multi-head latent attention's latent rows (false: its expanded keys and
  // values, for a model with set_latent_cache(false); model/tensor_shard.h, kv_cache_row).
  // n_state_slots: the linear layers' state slots (hybrid models).
  static KvCache allocate(const ModelConfig& cfg, int64_t n_slots, const at::TensorOptions& options,
                          int tensor_parallel = 1, int64_t mtp_layers = 0, bool latent = true,
                          int64_t n_state_slots = 0);
  int64_t n_slots() const { return k.empty() ? 0 : k[0].size(0); }
  int64_t n_state_slots() const { return conv_state.empty() ? 0 : conv_state[0].size(0); }
  // Every linear layer's state of slot `from` copied into slot `to` (a group's fork).
  void copy_state(int64_t from, int64_t to);
  // Bytes one sequence's state takes over all linear layers.
  int64_t state_bytes_per_sequence() const;
  bool quantized() const { return !k_scale.empty(); }
  // Writes K and V [n, Hkv_local, D] (any floating dtype) at `slots` [n] of `layer`.
  void store(int64_t layer, const at::Tensor& slots, const at::Tensor& keys, const at::Tensor& values);
  // Rows `slots` [n] of layer's keys (key) or values as stored -> [n, Hkv_local, D], into
  // `out` when given (its first n rows; the same dtype). (torch has no CPU index_select
  // or index_copy for e4m3: an e4m3 cache moves its rows as bytes.)
  at::Tensor select(int64_t layer, bool key, const at::Tensor& slots, const at::Tensor& out = {}) const;
  // Rows of layer's keys (key) or values as stored, [..., Hkv_local, D] -> `dtype`, de-quantised.
  at::Tensor decoded(const at::Tensor& rows, int64_t layer, bool key, at::ScalarType dtype) const;
  // Bytes one token's keys and values take over all layers.
  int64_t bytes_per_token() const;
};

// One sequence of an incremental batch: n_new tokens after n_past cached ones.
struct CachedSequence {
  int64_t n_past = 0;
  int64_t n_new = 0;
  at::Tensor slots;  // [n_past + n_new] int64: the cache slot of every position 0..n_past+n_new-1
  int64_t state_slot = -1;  // hybrid models: its linear layers' state slot (KvCache::conv_state)
};

}  // namespace slimpi
