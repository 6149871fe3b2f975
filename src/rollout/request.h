// What the rollout engine is asked for and what it hands back.
#pragma once

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
};

}  // namespace slimpi
