// Evaluation on a held-out prompt set (deck table [eval]): greedy pass@1 (temperature
// 0, one sample per prompt) and, with eval.n_samples = n > 1, the unbiased pass@k
// estimator at the rollout temperature for k = 1, 2, 4, ... <= n:
//   pass@k = mean over prompts of 1 − C(n − c, k) / C(n, k),  c = correct samples
// (a sample is correct when its reward is >= 1). Metric names: eval/pass@1 (greedy),
// eval/mean_reward (greedy), eval/sampled_pass@k (n samples), eval/n_prompts, and with an
// environment eval/env_failed (greedy episodes that failed: they score 0).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace slimpi {

double pass_at_k(int64_t n, int64_t c, int64_t k);

}  // namespace slimpi
