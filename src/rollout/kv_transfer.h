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

  int64_t bytes() const { return static_cast<int64_t>(payload.size()); }
};

// The rows at `slots` (positions 0..n-1 of one sequence, in order) of every layer of `cache`.
KvTransfer gather_kv_rows(const KvCache& cache, int64_t group_index, const std::vector<int64_t>& slots);

// Writes positions first..n-1 of `t` at `slots` (one per position, slots.size() == n - first).
// Throws, naming the group, when t's rows do not have this cache's layout.
void scatter_kv_rows(KvCache& cache, const KvTransfer& t, int64_t first, const std::vector<int64_t>& slots);

// One message's bytes, and back (a truncated or inconsistent message throws).
std::string encode_kv_transfer(const KvTransfer& t);
KvTransfer decode_kv_transfer(const std::string& bytes);

}  // namespace slimpi
