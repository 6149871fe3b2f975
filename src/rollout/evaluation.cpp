#include "rollout/evaluation.h"

namespace slimpi {

double pass_at_k(int64_t n, int64_t c, int64_t k) {
  if (n - c < k) return 1.0;
  // C(n-c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i)
  double miss = 1.0;
  for (int64_t i = n - c + 1; i <= n; ++i) miss *= 1.0 - double(k) / double(i);
  return 1.0 - miss;
}

}  // namespace slimpi
