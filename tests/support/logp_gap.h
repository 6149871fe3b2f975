// The gap the engine tests bound: |trainer log-prob - engine log-prob| of every sampled
// token, the samples packed and scored by the model's forward at the sampling temperature
// (what train/train_rollout_logprob_abs_diff measures in a run).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/sample.h>

#include <vector>

#include "model/log_probs.h"
#include "model/transformer.h"

namespace slimpi::testing {

// -> [R] fp32, one entry per response token of `samples`, in their order.
inline at::Tensor trainer_engine_logp_gap(const Transformer& m, const std::vector<Sample>& samples, double temperature) {
  at::NoGradGuard no_grad;
  std::vector<int64_t> tokens, seq_lens, prompt_lens;
  std::vector<float> engine_logp;
  for (const auto& s : samples) {
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
    seq_lens.push_back(int64_t(s.tokens.size()));
    prompt_lens.push_back(s.prompt_length);
    engine_logp.insert(engine_logp.end(), s.rollout_log_probs.begin(), s.rollout_log_probs.end());
  }
  const at::Tensor t = at::tensor(tokens, at::kLong);
  const at::Tensor trainer =
      score_tokens(m.forward_packed(t, seq_lens), response_positions(t, seq_lens, prompt_lens), temperature, false).logp;
  return (trainer - at::tensor(engine_logp)).abs();
}

}  // namespace slimpi::testing
