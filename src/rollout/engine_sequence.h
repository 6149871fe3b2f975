// Engine::Sequence — one sequence in the rollout engine (rollout/engine.h): its tokens,
// KV block table, the per-token rollout fields it will return, and (speculative
// decoding) the draft's cache progress and chain. Private to the engine's sources
// (engine.cpp, engine_speculation.cpp); owned by Engine's queues.
#pragma once

#include <memory>
#include <vector>

#include "rollout/engine.h"

namespace slimpi {

// A sequence in the engine. Before its group forks, the group's prompt is one
// Sequence with sample_index = -1 that holds the blocks the fork will need.
struct Engine::Sequence {
  std::shared_ptr<const GenerationRequest> request;
  int64_t sample_index = -1;
  std::vector<int64_t> tokens;  // prompt + response so far
  int64_t prompt_length = 0;
  int64_t n_computed = 0;       // leading tokens whose K/V are in `blocks`
  std::vector<int32_t> blocks;  // block table: position p lives in blocks[p / block_size]
  std::vector<int32_t> fork_blocks;  // group prompt: partial-block copies for samples 1..n-1
  int32_t state_slot = -1;           // hybrid models: its Gated DeltaNet state (KvCache::conv_state), while admitted
  std::vector<float> log_probs;
  std::vector<int32_t> support;  // per response token: size of the sampling set (0: whole vocab)
  std::vector<int64_t> versions;
  int64_t arrival = 0;  // admission order; the largest is the youngest
  SampleStatus finish = SampleStatus::Truncated;
  // Speculative decoding (rollout/engine_speculation.cpp). The draft's KV entries [0,
  // mtp_computed) are in the cache (entry m in the slot of position m + 1); the drafted
  // tokens that follow tokens.back(), with their draft distributions [D, V] (empty when
  // greedy); this iteration's forward rows: row_base holds position row_first, row_count of
  // them (row_base -1: none).
  int64_t mtp_computed = 0;
  std::vector<int64_t> draft;
  std::vector<float> draft_q;
  int64_t row_base = -1, row_first = 0, row_count = 0;
  int64_t spec_drafted = 0, spec_accepted = 0, spec_passes = 0;
  // A hybrid model's chain whose state was restored (Engine::verify_draft): positions below
  // this keep the MoE routing the verify pass recorded (the pass their log-probs came
  // from); the forward that computes them again does not overwrite it.
  int64_t routing_kept_until = 0;
  // A decode engine's group whose prompt a prefill engine computed (rollout.prefill_ranks):
  // its rows, written at admission and then dropped (a preempted group recomputes here).
  std::shared_ptr<const KvTransfer> arrived_kv;

  bool is_group() const { return sample_index < 0; }
  int64_t n_response() const { return static_cast<int64_t>(tokens.size()) - prompt_length; }
  int64_t pending() const { return static_cast<int64_t>(tokens.size()) - n_computed; }
  // The KV cache slot of position p (blocks of block_size slots).
  int64_t slot(int64_t p, int64_t block_size) const { return int64_t(blocks[p / block_size]) * block_size + p % block_size; }
};

}  // namespace slimpi
