// Per-token log-probabilities and entropies of response tokens (docs/rl_loop.md), the one
// definition the engine and the trainer share:
//   z = fp32 logits / temperature;  logp = z[target] − logsumexp(z over the support)
// where the support is the whole vocabulary, or — for a token drawn with top_k/top_p
// (kernels/sampling.h reports the size k of its candidate set) — the k largest entries
// of z: the renormalised truncated distribution the sampler drew from (slime's
// top-p-aware training). Entropy is over the full vocabulary. Response token j of a
// sequence sits at position P + j (P = prompt length) and is scored by the logits at
// position P + j − 1.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace slimpi {

// Which rows of a packed batch's logits score which tokens.
struct ScoredPositions {
  at::Tensor logit_rows;  // [N] int64: rows of the packed logits
  at::Tensor targets;     // [N] int64: the token each row scores
};

// For B sequences back to back in `tokens` [T] (lengths seq_lens), the response tokens
// of each (the last seq_lens[b] - prompt_lens[b] of it), in order. prompt_lens[b] >= 1.
ScoredPositions response_positions(const at::Tensor& tokens, const std::vector<int64_t>& seq_lens,
                                   const std::vector<int64_t>& prompt_lens);

struct TokenLogProbs {
  at::Tensor logp;     // [N] fp32
  at::Tensor entropy;  // [N] fp32 (undefined unless asked for)
};

// Whether any token of `support` [N] was drawn from a cut candidate set (an entry > 0).
bool any_truncated(const at::Tensor& support);

// z [N, V] fp32 (already divided by the temperature), targets [N] int64, support [N]
// int64 (0: whole vocabulary; undefined: all 0) -> logp [N].
at::Tensor log_probs_over_support(const at::Tensor& z, const at::Tensor& targets, const at::Tensor& support);

// logits [T, V] (any float type) -> log-probs of `at.targets` at rows `at.logit_rows`.
// support: [N] int64 as above (undefined: whole vocabulary).
TokenLogProbs score_tokens(const at::Tensor& logits, const ScoredPositions& at, double temperature,
                           bool with_entropy, const at::Tensor& support = {});

}  // namespace slimpi
