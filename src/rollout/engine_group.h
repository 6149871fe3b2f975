// Engine groups — the ranks of one tensor-parallel rollout engine (rollout.tensor_parallel
// = e > 1), and what passes between them.
//
// The group's first rank (the leader) runs the Engine: the router talks to it alone, and
// it keeps the scheduler, the block tables, the prefix cache and the sampler. Before
// each forward it announces the batch to the group: the KV blocks to copy first (a
// fork's copy of its prompt's shared partial block; a hybrid model's fork also copies its
// prompt's linear-layer state slot), then the tokens and every
// sequence's past length, new-token count and cache slots. Every rank runs that forward
// on its shard of the model (model/tensor_shard.h: its query and key/value heads, MLP
// columns and vocabulary rows) over its heads' KV cache, joined by the model's
// tensor-parallel all-reduces; the logits' vocabulary shards are gathered on the leader,
// which samples from whole rows. The tokens are the leader's draws alone, so every rank
// of the group agrees on them by construction. The other ranks (followers) hold no
// scheduler state: between the leader's calls they wait in EngineFollower::follow()
// until it releases them.
// Invariant: every rank of a group has the same KV slots and state slots (one EngineConfig),
// and after each announced forward their caches hold the same tokens slot by slot and the
// same sequences' states state slot by state slot (each its heads).
#pragma once

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "model/kv_cache.h"
#include "model/precision.h"
#include "model/transformer.h"
#include "rollout/engine.h"

namespace slimpi {

class Comm;

// One forward of an engine, as the leader announces it (and as the engine runs it).
struct EngineForward {
  std::vector<std::pair<int32_t, int32_t>> block_copies;  // (source, destination) KV blocks, before the forward
  std::vector<std::pair<int32_t, int32_t>> state_copies;  // hybrid models: (source, destination) state slots, before it
  std::vector<int64_t> tokens;                            // the new tokens of every sequence, back to back
  std::vector<int64_t> n_past, n_new;                     // per sequence
  std::vector<int64_t> slots;  // per sequence, back to back: the cache slot of each of its n_past + n_new positions
  std::vector<int64_t> state_slots;  // hybrid models: per sequence, its linear layers' state slot (else empty)
  // The rows of `tokens` whose logits the forward returns, in order (nullopt: every row).
  std::optional<std::vector<int64_t>> logit_rows;
  bool release = false;  // no forward: the followers return from follow()
};

// Announcements are control messages over MPI (`group`: the engine group's MPI
// communicator, the ranks of the model's tensor-parallel Comm in the same order), so a
// follower waits asleep between forwards (parallel/mpi_bytes.h, recv_message); the
// forward's collectives run over the model's Comm (MPI or NCCL).
// Leader: sends `f` to the group's other ranks.
void announce(MPI_Comm group, const EngineForward& f);
// Follower: the leader's next announcement.
EngineForward receive_announcement(MPI_Comm group);

// Copies whole KV blocks (keys, values and the routing trace) within `cache`.
void copy_kv_blocks(KvCache& cache, const std::vector<std::pair<int32_t, int32_t>>& copies, int64_t block_size);

// Runs `f` through `model` (no gradient, in `precision`), writing the new tokens' keys
// and values into `cache`: logits [R, V] ([R, Vp / e], this rank's vocabulary columns, in
// a tensor-parallel group) for f.logit_rows (R of them; all T_new rows without). moe: records the routing (leader). hidden: the
// final norm's output [T_new, d] (a speculating engine's draft input). to_logits = false:
// no LM head, the final norm's output is returned (a prefill engine's forwards).
at::Tensor run_engine_forward(const Transformer& model, KvCache& cache, Precision precision, const EngineForward& f,
                              MoeTrace* moe, at::Tensor* hidden = nullptr, bool to_logits = true);

// A tensor-parallel group's logits shards [T, Vp / e] -> the whole rows [T, V] on the
// group's first rank (padding dropped); undefined on the others. Collective.
at::Tensor gather_vocab_shards(Comm& group, const at::Tensor& local, int64_t vocab_size);

// A follower rank of an engine group: its model shard's KV cache (allocated at
// construction, the leader's slots), and the loop that runs the leader's forwards.
// Owned by RolloutSide on the followers; single-threaded.
class EngineFollower {
 public:
  // group: the engine group's MPI communicator (this rank's place in it is its tensor rank).
  EngineFollower(const EngineConfig& cfg, const Transformer& model, MPI_Comm group);
  // Runs the announced forwards until the leader releases the group.
  void follow();

 private:
  EngineConfig cfg_;
  const Transformer& model_;
  MPI_Comm group_;
  KvCache cache_;
  Precision precision_;
};

}  // namespace slimpi
