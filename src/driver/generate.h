// `slimpi generate DECK`: the rollout side alone (slime's debug_rollout_only; no reward
// style runs, only an environment's episode rewards, in raw_reward). Every rank is an
// engine; rank 0 routes. The prompts of data.path (key
// data.input_key) become groups of rollout.n_samples_per_prompt samples, group i drawing
// from mix_seed(run.seed, 0, i); the policy is the seeded init or model.init_from.
// Writes rollouts.h5 (in group order) and metrics.h5/.csv (one row of rollout/* and
// perf/* metrics) to the run directory, with a progress line on rank 0.
#pragma once

#include "driver/run_context.h"

namespace slimpi {

int run_generate(RunContext& ctx);

}  // namespace slimpi
