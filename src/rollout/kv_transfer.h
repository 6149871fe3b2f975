// KvTransfer — the keys and values (and an MoE policy's routing trace) of a prompt's
// first n positions, as a prefill engine hands them to a decode engine
// (rollout.prefill_ranks, rollout/disaggregated_router.h).
//
// Layout of `payload`: for every cache layer l, the K rows then the V rows of positions
// 0..n-1 in the cache's storage dtype ([n, Hkv, D] each; an e4m3 cache's bytes as they
// are, nothing re-quantised), then the routing rows [n, n_moe_layers, k] int16. Position
// order is block-table order (position p lives in block p / block_size), so the receiver
// writes them into blocks of its own pool and its block tables and prefix cache work
// unchanged. `row_bytes` holds each section's bytes per position: the receiver checks
// them against its own cache (both engines come from one [rollout] table).
// A hybrid model's linear layers cache no rows: their state after position n - 1 (every
// linear layer's convolution state, then its recurrent state, fp32, as one state slot of
// the cache holds them) travels as `state`, `state_bytes` holding each tensor's bytes.
// Plain data: made by the prefill engine, moved over MPI as bytes, consumed at admission.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/kv_cache.h"

namespace slimpi {

struct KvTransfer {
  int64_t group_index = -1;
  int64_t n_positions = 0;
  std::vector<int64_t> row_bytes;  // per section (K and V of each layer, then routing if any): bytes a position
  std::string payload;             // the sections back to back, n_positions rows each
  std::vector<int64_t> state_bytes;  // hybrid models: per state tensor (conv, then recurrent, of each layer): bytes
  std::string state;                 // those states back to back (empty for other models)

  int64_t bytes() const { return static_cast<int64_t>(payload.size() + state.size()); }
};

// The rows at `slots` (positions 0..n-1 of one sequence, in order) of every layer of
// `cache`, and (state_slot >= 0, a hybrid model) the linear layers' state in that slot.
KvTransfer gather_kv_rows(const KvCache& cache, int64_t group_index, const std::vector<int64_t>& slots,
                          int64_t state_slot = -1);

// Writes positions first..n-1 of `t` at `slots` (one per position, slots.size() == n - first).
// Throws, naming the group, when t's rows do not have this cache's layout.
void scatter_kv_rows(KvCache& cache, const KvTransfer& t, int64_t first, const std::vector<int64_t>& slots);

// Writes t's linear-layer state into `state_slot` of `cache`. Throws, naming the group,
// when t carries none or one of another shape (the engines disagree on the model).
void scatter_state(KvCache& cache, const KvTransfer& t, int64_t state_slot);

// One message's bytes, and back (a truncated or inconsistent message throws).
std::string encode_kv_transfer(const KvTransfer& t);
KvTransfer decode_kv_transfer(const std::string& bytes);

}  // namespace slimpi
