#include "kernels/speculative.h"

#include <algorithm>

namespace slimpi {

ChainVerdict verify_chain(const float* z, const float* q, const int64_t* drafts, int64_t D, int64_t vocab,
                          const SamplingRow& rule, const double* accept_u, const double* residual_u, double bonus_u) {
  ChainVerdict v;
  std::vector<float> p(static_cast<size_t>(vocab));
  for (int64_t j = 0; j < D; ++j) {
    const float* zj = z + j * vocab;
    const int32_t support = sampling_distribution(zj, vocab, rule, p.data());
    const int64_t d = drafts[j];
    if (rule.temperature <= 0) {  // greedy: the draft stands when it is the arg-max
      const int64_t best = std::max_element(p.begin(), p.end()) - p.begin();
      v.tokens.push_back(best);
      v.support.push_back(support);
      if (best != d) return v;
      ++v.n_accepted;
      continue;
    }
    const float* qj = q + j * vocab;
    const double pd = p[size_t(d)], qd = qj[d];
    if (qd > 0 && accept_u[j] < std::min(1.0, pd / qd)) {
      v.tokens.push_back(d);
      v.support.push_back(support);
      ++v.n_accepted;
      continue;
    }
    // Rejected: a token from the residual max(0, p - q), renormalised (where p - q has no
    // positive mass, p and q agree to rounding: p itself).
    double total = 0;
    for (int64_t t = 0; t < vocab; ++t) total += std::max(0.0, double(p[size_t(t)]) - double(qj[t]));
    const bool from_p = !(total > 0);
    if (from_p)
      for (int64_t t = 0; t < vocab; ++t) total += p[size_t(t)];
    const double target = residual_u[j] * total;
    double cumulative = 0;
    int64_t chosen = -1, last = -1;
    for (int64_t t = 0; t < vocab; ++t) {
      const double w = from_p ? double(p[size_t(t)]) : std::max(0.0, double(p[size_t(t)]) - double(qj[t]));
      if (w <= 0) continue;
      last = t;
      cumulative += w;
      if (cumulative > target) {
        chosen = t;
        break;
      }
    }
    v.tokens.push_back(chosen >= 0 ? chosen : last);
    v.support.push_back(support);
    return v;
  }
  // Every draft accepted: one more token from p_D by the plain rule.
  SamplingRow bonus = rule;
  bonus.uniform = bonus_u;
  int64_t token = 0;
  int32_t support = 0;
  sample_tokens(z + D * vocab, 1, vocab, &bonus, &token, &support);
  v.tokens.push_back(token);
  v.support.push_back(support);
  return v;
}

}  // namespace slimpi
