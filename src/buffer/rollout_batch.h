// RolloutBatch — one step's rollouts on their way from the engines to the trainers:
// the kept groups' samples with their rewards, the ones generated but not trained, and
// the counters its rollout metrics come from. Filled by the rollout and reward phases
// (samples on the router; counters on every rollout rank), handed out by buffer,
// logged by record (driver/step_phases.h); under train.async = "one_step_off" it waits
// a step in between (driver/schedule_one_step_off.cpp), and a checkpoint stores it.
#pragma once

#include <slimpi/sample.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "rollout/engine.h"

namespace slimpi {

struct RolloutBatch {
  std::vector<Sample> kept;    // generated samples of the kept groups, group order (rewards set)
  std::vector<Sample> unused;  // generated, not trained: filtered groups and surplus (status set)
  EngineStats engine_stats;    // summed over the engines
  int64_t groups_generated = 0, groups_dropped = 0, rounds = 0;
  double score_s = 0;          // router: time spent in the reward style, over all rounds
  double teacher_s = 0;        // router, teacher.placement = "rollout": the teacher's scoring of the kept samples
  double tail_s = -1;          // router: the rounds' long tails (RolloutSide::generate), summed; < 0 not measured
  double generate_s = 0;       // rollout ranks: wall time of its rounds (generation and scoring)
};

// A generated sample that is not trained, on its way to RolloutBatch::unused: status
// Filtered (its group's rewards all agree; reward 0), Surplus (kept by the filter
// beyond the batch's groups; reward NaN) or Stale (too old when its turn came; reward
// NaN). raw_reward stays. An episode its environment failed stays EnvFailed (reward
// NaN), whatever its group is retired as.
void retire(Sample& s, SampleStatus why);
// Whether an episode of the group [first, last) failed in its environment: the group is
// not trained (the failed reward says nothing about the policy).
bool any_episode_failed(std::vector<Sample>::const_iterator first, std::vector<Sample>::const_iterator last);

// What the rollout metrics of a batch read besides the batch.
struct RolloutMetricsInputs {
  int64_t step = 0;                  // the step that trains the batch (staleness is counted to it)
  int64_t n_samples_per_prompt = 1;  // rollout.n_samples_per_prompt
  int64_t rollout_batch_size = 0;    // groups a full batch keeps
  int64_t skipped_lines = 0, prompt_cursor = 0, epoch = 0;  // the prompt source's counters
};

// The rollout metrics of a batch (slime's names where slime has them): rollout/* means
// over the kept samples (raw_reward, rewards, response_len/mean and max,
// truncated_ratio, staleness/mean and max: versions between a sample's oldest token
// and `step`), group counts (zero_std/count: kept groups whose raw rewards all agree,
// dynamic_filter/drop_zero_std, short_batch_groups, groups_generated,
// sampling_rounds), the engines' counters (generated_tokens, prefill_tokens_computed,
// prompt_tokens_served, prefix_cache_hit_rate, preemptions), the prompt source's, and
// perf/reward_score_time, perf/rollout_tail_time, perf/rollout_tokens_per_s,
// perf/engine_iteration_s.
// A pure function of its arguments.
std::map<std::string, double> rollout_metrics(const RolloutBatch& batch, const RolloutMetricsInputs& in);
// The parts `slimpi generate` writes too: rollout/response_len/mean and max and
// truncated_ratio of `samples`; the engines' counters.
void add_response_metrics(const std::vector<Sample>& samples, std::map<std::string, double>& m);
void add_engine_metrics(const EngineStats& es, std::map<std::string, double>& m);
// Multi-turn episodes (rollout.environment): over every episode in `first` and `second`
// (trained or not; ReMax's greedy ones aside), the per-episode means and the error
// classes (rollout/env_*, perf/env_wait_time_fraction), and each metric the
// environment reported, rollout/env_metrics/<name>: its mean over the episodes that
// reported it (an episode's value: the sum over its replies); nothing without episodes.
void add_episode_metrics(const std::vector<Sample>& first, const std::vector<Sample>& second,
                         std::map<std::string, double>& m);

}  // namespace slimpi
