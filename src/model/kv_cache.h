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

struct KvCache {
  // (t: the engine's tensor-parallel size; Hkv_local = Hkv / t, or 1 when t > Hkv replicates the heads)
  std::vector<at::Tensor> k;  // n_layers (+ MTP depths) x [n_slots, Hkv_local, D]
  std::vector<at::Tensor> v;  // n_layers x [n_slots, Hkv_local, D]
  // Gathered keys/values of the sequences one attention call reads (the Gather decode
  // path, and prefill chunks with a cached past): [rows, n_kv_heads, D] each, re-used by
  // every layer and step, grown only when a call needs more rows.
  at::Tensor gathered_k, gathered_v;
  // Mixture-of-experts policies: the experts each slot's token ran, kept with its K/V so
  // that tokens served from the prefix cache still have their routing trace.
  at::Tensor routing;  // [n_slots, n_moe_layers, k] int16 (undefined for dense models)
  // tensor_parallel: the engine's group size; each rank caches its Hkv_local heads
  // (model/tensor_shard.h, local_kv_heads). mtp_layers: layers n_layers .. n_layers +
  // mtp_layers - 1 too, the first MTP depths' (a speculating engine's draft).
  static KvCache allocate(const ModelConfig& cfg, int64_t n_slots, const at::TensorOptions& options,
                          int tensor_parallel = 1, int64_t mtp_layers = 0);
  int64_t n_slots() const { return k.empty() ? 0 : k[0].size(0); }
};

// One sequence of an incremental batch: n_new tokens after n_past cached ones.
struct CachedSequence {
  int64_t n_past = 0;
  int64_t n_new = 0;
  at::Tensor slots;  // [n_past + n_new] int64: the cache slot of every position 0..n_past+n_new-1
};

}  // namespace slimpi
