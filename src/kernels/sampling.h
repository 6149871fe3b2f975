// Token sampling for a batch of rows of logits (the rollout engine's per-token loop).
//
// Per row b with temperature T, top_k, top_p and a uniform u in [0, 1):
//   T <= 0: greedy, the arg-max (lowest index among equal maxima).
//   else:   p ∝ exp(z / T). Candidates: all tokens in index order when top_k = 0 and
//           top_p = 1; otherwise tokens sorted by z descending (ties: lower index
//           first), cut to the top_k first (top_k > 0), then to the shortest prefix
//           whose probability (renormalised over the cut) reaches top_p. The token is
//           the first candidate whose cumulative renormalised probability exceeds u.
// The candidate set a token was drawn from (its "support") is reported per row: its size
// when the top_k/top_p cut made it smaller than the vocabulary, else 0. The candidates
// are the `support` largest logits, so the trainer recomputes the same renormalised
// distribution from its own logits and that size alone (model/log_probs.h).
// Two executors of this one rule: sample_tokens here (host, rows in parallel on torch's
// thread pool) and sample_tokens_tensor (kernels/sampling_tensor.h: torch ops on the
// logits' device, what the engine runs on a GPU). sample_tokens_reference is a third,
// plain twin, written independently (full sort of every row), that the tests compare
// both against.
#pragma once

#include <cstdint>

namespace slimpi {

struct SamplingRow {
  double temperature = 1.0;
  int64_t top_k = 0;     // 0 = off
  double top_p = 1.0;    // 1 = off
  double uniform = 0.5;  // in [0, 1)
};

// logits: [n_rows, vocab] row-major fp32 (host). tokens_out: [n_rows]. support_out:
// [n_rows] or null.
void sample_tokens(const float* logits, int64_t n_rows, int64_t vocab, const SamplingRow* rows, int64_t* tokens_out,
                   int32_t* support_out = nullptr);
void sample_tokens_reference(const float* logits, int64_t n_rows, int64_t vocab, const SamplingRow* rows,
                             int64_t* tokens_out, int32_t* support_out = nullptr);

// The distribution this rule draws one row from (its `uniform` unused), as probabilities
// over the whole vocabulary: the candidates' renormalised weights, 0 elsewhere; greedy
// (T <= 0) puts 1 on the arg-max. Returns the support as sample_tokens reports it.
// (Speculative decoding's target and draft distributions, kernels/speculative.h.)
int32_t sampling_distribution(const float* logits, int64_t vocab, const SamplingRow& row, float* probs_out);

}  // namespace slimpi
