// What the rollout engine is asked for and what it hands back.
#pragma once

#include <slimpi/sample.h>

#include <cstdint>
#include <string>
#include <vector>

namespace slimpi {

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // 1 = off
  int64_t max_new_tokens = 64;
  std::vector<int64_t> stop_token_ids;    // e.g. the tokenizer's EOS
  std::vector<std::string> stop_strings;  // matched on the decoded response
};

// One prompt group: n_samples responses to one prompt.
struct GenerationRequest {
  int64_t group_index = 0;
  std::vector<int64_t> prompt;  // token ids, non-empty
  int64_t n_samples = 1;
  SamplingParams params;
  uint64_t seed = 0;  // the group's stream: mix_seed(run seed, step, group_index)
  // Stop strings are matched on the response from this position on (a multi-turn
  // episode: its current turn, so that no earlier turn or observation completes one).
  int64_t stop_strings_from = 0;
};

// Rollout work that can leave one engine and enter another (train.async = "full"): a
// group not started yet (partial.tokens empty: n_samples responses to request.prompt),
// or one sample of a started group with its response so far (partial.index = the
// sample; tokens = prompt + response, with its log-probs, supports and weight
// versions), continued from its next position. Its KV is recomputed where it lands.
struct WorkItem {
  GenerationRequest request;
  Sample partial;

  bool is_group() const { return partial.tokens.empty(); }
  int64_t response_length() const { return is_group() ? 0 : partial.response_length(); }
};

}  // namespace slimpi
