#include "model/log_probs.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include <cmath>

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

bool any_truncated(const at::Tensor& support) {
  return support.defined() && support.numel() > 0 && support.gt(0).any().item<bool>();
}

at::Tensor log_probs_over_support(const at::Tensor& z, const at::Tensor& targets, const at::Tensor& support) {
  if (!any_truncated(support))
    return at::log_softmax(z, -1).gather(1, targets.unsqueeze(1)).squeeze(1);
  at::Tensor target_z = z.gather(1, targets.unsqueeze(1)).squeeze(1);  // [N]
  const int64_t V = z.size(1);
  at::Tensor sorted = std::get<0>(z.sort(-1, /*descending=*/true));                       // [N, V]
  at::Tensor k = at::where(support.gt(0), support, at::full_like(support, V));           // [N]
  at::Tensor outside = at::arange(V, support.options()).unsqueeze(0).ge(k.unsqueeze(1));  // [N, V]
  at::Tensor lse = at::logsumexp(sorted.masked_fill(outside, -INFINITY), -1);             // [N]
  return target_z - lse;
}

TokenLogProbs score_tokens(const at::Tensor& logits, const ScoredPositions& at, double temperature,
                           bool with_entropy, const at::Tensor& support) {
  at::Tensor z = logits.index_select(0, at.logit_rows).to(at::kFloat);  // [N, V]
  if (temperature != 1.0) z = z / temperature;
  TokenLogProbs out;
  if (with_entropy) {
    at::Tensor log_softmax = at::log_softmax(z, -1);  // [N, V]
    out.entropy = -(log_softmax.exp() * log_softmax).sum(-1);
    if (!any_truncated(support)) {
      out.logp = log_softmax.gather(1, at.targets.unsqueeze(1)).squeeze(1);
      return out;
    }
  }
  out.logp = log_probs_over_support(z, at.targets, support);
  return out;
}

}  // namespace slimpi
