#include "kernels/sampling.h"

#include "kernels/parallel_for.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

namespace slimpi {
namespace {

// Candidate order: z descending, then index ascending.
struct ByLogitDesc {
  const float* z;
  bool operator()(int32_t a, int32_t b) const { return z[a] > z[b] || (z[a] == z[b] && a < b); }
};

// The candidates of one row (T > 0): idx[0..n) in candidate order and their unnormalised
// weights p[0..n) = exp((z - z_max) / T) after the top-k and top-p cuts; returns n and sets
// *total = Σ p. Scratch: idx and p of vocab entries.
int64_t candidate_weights(const float* z, int64_t vocab, const SamplingRow& r, int32_t* idx, double* p, double* total) {
  const bool sorted = r.top_k > 0 || r.top_p < 1.0;
  int64_t n = vocab;
  for (int64_t v = 0; v < vocab; ++v) idx[v] = static_cast<int32_t>(v);
  if (sorted) {
    if (r.top_k > 0 && r.top_k < vocab) {
      n = r.top_k;
      std::partial_sort(idx, idx + n, idx + vocab, ByLogitDesc{z});
    } else {
      std::sort(idx, idx + vocab, ByLogitDesc{z});
    }
  }
  double zmax = z[idx[0]];
  if (!sorted)
    for (int64_t v = 1; v < vocab; ++v) zmax = std::max(zmax, double(z[v]));
  *total = 0;
  for (int64_t i = 0; i < n; ++i) *total += p[i] = std::exp((double(z[idx[i]]) - zmax) / r.temperature);
  if (r.top_p < 1.0) {
    double mass = 0;
    int64_t keep = 0;
    while (keep < n) {
      mass += p[keep++];
      if (mass >= r.top_p * *total) break;
    }
    n = keep;
    *total = mass;
  }
  return n;
}

int64_t argmax(const float* z, int64_t vocab) {
  int64_t best = 0;
  for (int64_t v = 1; v < vocab; ++v)
    if (z[v] > z[best]) best = v;
  return best;
}

// One row, using `idx` (vocab entries) and `p` (vocab entries) as scratch. *support:
// the size of the candidate set when it is smaller than the vocabulary, else 0.
int64_t sample_row(const float* z, int64_t vocab, const SamplingRow& r, int32_t* idx, double* p, int32_t* support) {
  *support = 0;
  if (r.temperature <= 0) return argmax(z, vocab);
  double total = 0;
  const int64_t n = candidate_weights(z, vocab, r, idx, p, &total);
  if (n < vocab) *support = static_cast<int32_t>(n);
  double cumulative = 0;
  const double target = r.uniform * total;
  for (int64_t i = 0; i < n; ++i) {
    cumulative += p[i];
    if (cumulative > target) return idx[i];
  }
  return idx[n - 1];
}

}  // namespace

void sample_tokens(const float* logits, int64_t n_rows, int64_t vocab, const SamplingRow* rows, int64_t* tokens_out,
                   int32_t* support_out) {
  at::parallel_for(0, n_rows, 1, [&](int64_t begin, int64_t end) {
    // Scratch per thread, kept across calls: grown to the vocabulary once, never refilled
    // (sample_row writes every entry it reads).
    thread_local std::vector<int32_t> idx;
    thread_local std::vector<double> p;
    if (int64_t(idx.size()) < vocab) {
      idx.resize(vocab);
      p.resize(vocab);
    }
    for (int64_t b = begin; b < end; ++b) {
      int32_t support = 0;
      tokens_out[b] = sample_row(logits + b * vocab, vocab, rows[b], idx.data(), p.data(), &support);
      if (support_out) support_out[b] = support;
    }
  });
}

int32_t sampling_distribution(const float* logits, int64_t vocab, const SamplingRow& row, float* probs_out) {
  std::fill(probs_out, probs_out + vocab, 0.0f);
  if (row.temperature <= 0) {
    probs_out[argmax(logits, vocab)] = 1.0f;
    return 0;
  }
  thread_local std::vector<int32_t> idx;
  thread_local std::vector<double> p;
  if (int64_t(idx.size()) < vocab) {
    idx.resize(vocab);
    p.resize(vocab);
  }
  double total = 0;
  const int64_t n = candidate_weights(logits, vocab, row, idx.data(), p.data(), &total);
  for (int64_t i = 0; i < n; ++i) probs_out[idx[i]] = float(p[i] / total);
  return n < vocab ? static_cast<int32_t>(n) : 0;
}

void sample_tokens_reference(const float* logits, int64_t n_rows, int64_t vocab, const SamplingRow* rows,
                             int64_t* tokens_out, int32_t* support_out) {
  for (int64_t b = 0; b < n_rows; ++b) {
    const float* z = logits + b * vocab;
    const SamplingRow& r = rows[b];
    std::vector<std::pair<double, int64_t>> c;  // (z, token)
    for (int64_t v = 0; v < vocab; ++v) c.emplace_back(z[v], v);
    if (support_out) support_out[b] = 0;
    if (r.temperature <= 0) {
      tokens_out[b] = std::max_element(c.begin(), c.end(), [](auto& a, auto& x) { return a.first < x.first; })->second;
      continue;
    }
    if (r.top_k > 0 || r.top_p < 1.0)
      std::stable_sort(c.begin(), c.end(), [](const auto& a, const auto& x) { return a.first > x.first; });
    if (r.top_k > 0 && r.top_k < vocab) c.resize(r.top_k);
    double zmax = -INFINITY;
    for (auto& [zz, v] : c) zmax = std::max(zmax, zz);
    std::vector<double> w;
    for (auto& [zz, v] : c) w.push_back(std::exp((zz - zmax) / r.temperature));
    double total = std::accumulate(w.begin(), w.end(), 0.0);
    if (r.top_p < 1.0) {
      double mass = 0;
      size_t keep = 0;
      while (keep < w.size() && mass < r.top_p * total) mass += w[keep++];
      w.resize(keep);
      c.resize(keep);
      total = mass;
    }
    if (support_out && int64_t(c.size()) < vocab) support_out[b] = static_cast<int32_t>(c.size());
    double cumulative = 0;
    int64_t chosen = c.back().second;
    for (size_t i = 0; i < w.size(); ++i) {
      cumulative += w[i];
      if (cumulative > r.uniform * total) {
        chosen = c[i].second;
        break;
      }
    }
    tokens_out[b] = chosen;
  }
}

}  // namespace slimpi
