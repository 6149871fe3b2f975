#include "train/micro_batches.h"

#include <slimpi/error.h>

namespace slimpi {

std::vector<std::vector<int64_t>> plan_micro_batches(const std::vector<int64_t>& lengths, int64_t n_micro_batches,
                                                     int64_t max_tokens) {
  const int64_t n = static_cast<int64_t>(lengths.size());
  std::vector<std::vector<int64_t>> out;
  if (n == 0) return out;
  if (max_tokens > 0) {
    std::vector<int64_t> used;  // tokens in each micro-batch
    for (int64_t i = 0; i < n; ++i) {
      size_t b = 0;
      while (b < out.size() && used[b] + lengths[i] > max_tokens) ++b;
      if (b == out.size()) {
        out.emplace_back();
        used.push_back(0);
      }
      out[b].push_back(i);
      used[b] += lengths[i];
    }
    return out;
  }
  SLIMPI_CHECK(n_micro_batches >= 1, "n_micro_batches must be at least 1");
  const int64_t k = std::min(n_micro_batches, n);
  for (int64_t b = 0; b < k; ++b) {
    out.emplace_back();
    for (int64_t i = b * n / k; i < (b + 1) * n / k; ++i) out.back().push_back(i);
  }
  return out;
}

}  // namespace slimpi
