// slimpi::Sample — one generated response to one prompt: what the rollout side hands
// to the buffer and the trainer, and what rollouts.h5 stores one row of.
//
// Fields follow slime's Sample (reference/slime.md): group_index identifies the
// prompt group in a step, index the sample within its group (0..n_samples_per_prompt).
// Invariant: rollout_log_probs.size() == response_tokens.size() once generated.
#pragma once

#include <cstdint>
#include <vector>

namespace slimpi {

// Stored as int8 in rollouts.h5 (the attribute `status_names` lists them).
enum class SampleStatus : int8_t {
  Pending = 0,    // not generated yet
  Completed = 1,  // stopped on a stop token/string
  Truncated = 2,  // hit max new tokens
  Aborted = 3,    // generated but not used: over-sampling surplus beyond the batch
  Failed = 4,     // the engine or reward failed on it
  Filtered = 5,   // dropped by the dynamic filter (its group's rewards all agree)
};

struct Sample {
  int64_t step = 0;
  int64_t group_index = 0;
  int64_t index = 0;
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> response_tokens;
  std::vector<float> rollout_log_probs;  // [response length], fp32, logits / temperature
  float reward = 0.0f;                   // after group post-processing (NaN: never post-processed)
  float raw_reward = 0.0f;               // as the reward style returned it
  float advantage = 0.0f;                // the first response token's advantage (GRPO: every token's)
  std::vector<float> advantages;         // [response length] per-token advantages (empty: not computed)
  SampleStatus status = SampleStatus::Pending;
  int64_t weight_version = 0;            // weights that produced the response
};

}  // namespace slimpi
