#include "train/packed_batch.h"

#include <ATen/ATen.h>
#include <fmt/ranges.h>
#include <slimpi/error.h>

#include "model/transformer.h"
#include "model/head_log_probs.h"

namespace slimpi {

at::Tensor per_token_tensor(const std::vector<float>& v, int64_t n, float fill, const at::Device& device) {
  if (v.empty()) return at::full({n}, fill, at::TensorOptions().dtype(at::kFloat).device(device));
  SLIMPI_CHECK(int64_t(v.size()) == n, "per-token vector of {} entries for {} response tokens", v.size(), n);
  return at::tensor(v, at::kFloat).to(device);
}

PackedBatch pack(const std::vector<Sample>& samples, const std::vector<int64_t>& which, const at::Device& device) {
  PackedBatch b;
  std::vector<int64_t> tokens, owner;
  for (size_t j = 0; j < which.size(); ++j) {
    const Sample& s = samples[which[j]];
    owner.insert(owner.end(), s.response_length(), static_cast<int64_t>(j));
    if (s.context_starts.empty()) {
      tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
      b.seq_lens.push_back(static_cast<int64_t>(s.tokens.size()));
      b.prompt_lens.push_back(s.prompt_length);
      continue;
    }
    // One sequence per context (see the header), each but the last ending with the next
    // context's first token so that the response rows stay the sample's, in order.
    const int64_t R = s.response_length();
    const auto response = s.tokens.begin() + s.prompt_length;
    for (size_t c = 0; c < s.context_starts.size(); ++c)
      SLIMPI_CHECK(s.context_starts[c] > (c == 0 ? 0 : s.context_starts[c - 1]) && s.context_starts[c] < R,
                   "sample (step {}, group {}, index {}): context starts {} are not increasing within its {} "
                   "response tokens", s.step, s.group_index, s.index, fmt::join(s.context_starts, ", "), R);
    int64_t from = -s.prompt_length;  // response offset where the sequence begins (the prompt's first token)
    for (size_t c = 0; c <= s.context_starts.size(); ++c) {
      const bool last = c == s.context_starts.size();
      const int64_t to = last ? R : s.context_starts[c] + 1;  // past the sequence's last token
      tokens.insert(tokens.end(), response + from, response + to);
      b.seq_lens.push_back(to - from);
      b.prompt_lens.push_back(c == 0 ? s.prompt_length : 1);
      if (!last) from = s.context_starts[c];
    }
  }
  b.tokens = at::tensor(tokens, at::kLong).to(device);
  b.sample_of_token = at::tensor(owner, at::kLong).to(device);
  bool truncated = false;
  for (int64_t i : which) truncated = truncated || !samples[i].sampling_support.empty();
  if (truncated) {
    std::vector<int64_t> support;
    for (int64_t i : which) {
      const Sample& s = samples[i];
      if (s.sampling_support.empty()) support.insert(support.end(), s.response_length(), 0);
      else support.insert(support.end(), s.sampling_support.begin(), s.sampling_support.end());
    }
    b.support = at::tensor(support, at::kLong).to(device);
  }
  return b;
}

at::Tensor gather_field(const std::vector<Sample>& samples, const std::vector<int64_t>& which,
                        std::vector<float> Sample::*field, float fill, const at::Device& device) {
  std::vector<at::Tensor> parts;
  for (int64_t i : which)
    parts.push_back(per_token_tensor(samples[i].*field, samples[i].response_length(), fill, device));
  return at::cat(parts);
}

at::Tensor packed_routing(const std::vector<Sample>& samples, const std::vector<int64_t>& which,
                          const ModelConfig& cfg, const at::Device& device, bool required) {
  const int64_t L = cfg.n_moe_layers(), k = cfg.n_experts_per_tok, width = L * k;
  int64_t T = 0;
  for (int64_t i : which) T += samples[i].packed_length();
  at::Tensor out = at::full({T, L, k}, -1, at::kLong);
  int64_t row = 0;
  for (int64_t i : which) {
    const Sample& s = samples[i];
    const int64_t rows = static_cast<int64_t>(s.routing.size()) / width;
    SLIMPI_CHECK(s.context_starts.empty() || (s.routing.empty() && !required),
                 "sample (step {}, group {}, index {}): a trajectory split into {} contexts has no routing trace, and "
                 "train.routing_replay needs one", s.step, s.group_index, s.index, s.context_starts.size() + 1);
    SLIMPI_CHECK((s.routing.empty() && !required) || (int64_t(s.routing.size()) == rows * width &&
                                                       rows == int64_t(s.tokens.size()) - 1),
                 "sample (step {}, group {}, index {}): a routing trace of {} expert ids for {} tokens; this model "
                 "needs (tokens - 1) x {} MoE layers x top-{} (train.routing_replay replays them)",
                 s.step, s.group_index, s.index, s.routing.size(), s.tokens.size(), L, k);
    for (size_t j = 0; j < s.routing.size(); j += size_t(k))  // k distinct experts in range per token and layer
      for (int64_t a = 0; a < k; ++a) {
        const int16_t e = s.routing[j + size_t(a)];
        SLIMPI_CHECK(e >= 0 && e < cfg.n_experts, "sample (step {}, group {}, index {}): routing trace names expert "
                     "{}; the model has {}", s.step, s.group_index, s.index, e, cfg.n_experts);
        for (int64_t b = 0; b < a; ++b)
          SLIMPI_CHECK(s.routing[j + size_t(b)] != e, "sample (step {}, group {}, index {}): routing trace names "
                       "expert {} twice for one token", s.step, s.group_index, s.index, e);
      }
    if (rows > 0)
      out.narrow(0, row, rows).copy_(at::tensor(std::vector<int64_t>(s.routing.begin(), s.routing.end()), at::kLong)
                                         .view({rows, L, k}));
    row += s.packed_length();
  }
  return out.to(device);
}

TokenLogProbs packed_log_probs(const Transformer& model, const PackedBatch& b, Precision precision,
                               double temperature, bool with_entropy, MoeTrace* moe, at::Tensor* hidden_out) {
  at::Tensor hidden;  // [T, d]
  {
    ForwardPrecision scope(precision, model.device());
    hidden = model.forward_packed_hidden(b.tokens, b.seq_lens, moe);
  }
  if (hidden_out) *hidden_out = hidden;
  return head_token_log_probs(model, b, hidden, precision, temperature, with_entropy);
}

TokenLogProbs head_token_log_probs(const Transformer& model, const PackedBatch& b, const at::Tensor& hidden,
                                   Precision precision, double temperature, bool with_entropy) {
  const ScoredPositions positions = response_positions(b.tokens, b.seq_lens, b.prompt_lens);
  const bool bf16 = precision == Precision::BF16;
  const auto split = model.context_split(b.seq_lens);
  if (!split)
    return head_log_probs(hidden, model.lm_head(), positions, temperature, with_entropy, b.support,
                          vocab_shard_of(model), bf16);
  // Context parallelism: this rank scores the tokens its rows predict, and every rank of
  // the group gets every token's (train/packed_batch.h).
  const ContextSplit::Items it = split->items(positions.logit_rows);
  const ScoredPositions mine{it.local_rows, positions.targets.index_select(0, it.local_items)};
  TokenLogProbs lp = head_log_probs(hidden, model.lm_head(), mine, temperature, with_entropy,
                                    b.support.defined() ? b.support.index_select(0, it.local_items) : b.support,
                                    vocab_shard_of(model), bf16);
  lp.logp = split->gather_items(it, lp.logp);  // [N]
  if (lp.entropy.defined()) lp.entropy = split->gather_items(it, lp.entropy);
  return lp;
}

VocabShard vocab_shard_of(const Transformer& model) {
  const TensorShard& tp = model.tensor_shard();
  return tp.size > 1 ? VocabShard{tp.comm, model.vocab_begin(), model.n_real_vocab()} : VocabShard{};
}

at::Tensor reducer_weights(const std::vector<Sample>& samples, const std::vector<int64_t>& which, const PackedBatch& b,
                           const at::Tensor& mask, double n_samples, double n_masked, bool per_token) {
  if (per_token) return mask / n_masked;
  std::vector<double> denominators;
  for (int64_t i : which) denominators.push_back(std::max(mask_sum(samples[size_t(i)]), 1.0));
  return mask / (at::tensor(denominators, at::kDouble).to(mask.device()).to(at::kFloat).index_select(0, b.sample_of_token) *
                 n_samples);
}

double mask_sum(const Sample& s) {
  if (s.loss_mask.empty()) return static_cast<double>(s.response_length());
  double sum = 0;
  for (float m : s.loss_mask) sum += m;
  return sum;
}

}  // namespace slimpi
