#include "train/log_probs.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

namespace slimpi {

ScoredPositions response_positions(const at::Tensor& tokens, const std::vector<int64_t>& seq_lens,
                                   const std::vector<int64_t>& prompt_lens) {
  SLIMPI_CHECK(seq_lens.size() == prompt_lens.size(), "{} sequences but {} prompt lengths", seq_lens.size(),
               prompt_lens.size());
  std::vector<int64_t> rows;
  int64_t start = 0;
  for (size_t b = 0; b < seq_lens.size(); ++b) {
    SLIMPI_CHECK(prompt_lens[b] >= 1 && prompt_lens[b] <= seq_lens[b], "sequence {}: prompt length {} of {}", b,
                 prompt_lens[b], seq_lens[b]);
    for (int64_t t = prompt_lens[b]; t < seq_lens[b]; ++t) rows.push_back(start + t - 1);
    start += seq_lens[b];
  }
  ScoredPositions p;
  p.logit_rows = at::tensor(rows, at::kLong).to(tokens.device());
  p.targets = tokens.index_select(0, p.logit_rows + 1);
  return p;
}

TokenLogProbs score_tokens(const at::Tensor& logits, const ScoredPositions& at, double temperature,
                           bool with_entropy) {
  at::Tensor z = logits.index_select(0, at.logit_rows).to(at::kFloat);  // [N, V]
  if (temperature != 1.0) z = z / temperature;
  at::Tensor log_softmax = at::log_softmax(z, -1);                      // [N, V]
  TokenLogProbs out;
  out.logp = log_softmax.gather(1, at.targets.unsqueeze(1)).squeeze(1);  // [N]
  if (with_entropy) out.entropy = -(log_softmax.exp() * log_softmax).sum(-1);
  return out;
}

}  // namespace slimpi
