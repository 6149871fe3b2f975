#include "buffer/rollout_batch.h"

#include <slimpi/error.h>

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "env/environment.h"

namespace slimpi {

void retire(Sample& s, SampleStatus why) {
  SLIMPI_CHECK(why == SampleStatus::Filtered || why == SampleStatus::Surplus || why == SampleStatus::Stale ||
                   why == SampleStatus::Baseline,
               "retire: status {} is not one of an untrained sample", int(why));
  if (s.status == SampleStatus::EnvFailed) {
    s.reward = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  s.status = why;
  s.reward = why == SampleStatus::Filtered ? 0.0f : std::numeric_limits<float>::quiet_NaN();
}

bool any_episode_failed(std::vector<Sample>::const_iterator first, std::vector<Sample>::const_iterator last) {
  return std::any_of(first, last, [](const Sample& s) { return s.status == SampleStatus::EnvFailed; });
}

void add_response_metrics(const std::vector<Sample>& samples, std::map<std::string, double>& m) {
  const double n = std::max<double>(1, double(samples.size()));
  double len = 0, max_len = 0, truncated = 0;
  for (const Sample& s : samples) {
    len += double(s.response_length());
    max_len = std::max(max_len, double(s.response_length()));
    truncated += s.status == SampleStatus::Truncated;
  }
  m["rollout/response_len/mean"] = len / n;
  m["rollout/response_len/max"] = max_len;
  m["rollout/truncated_ratio"] = truncated / n;
}

void add_engine_metrics(const EngineStats& es, std::map<std::string, double>& m) {
  m["rollout/generated_tokens"] = double(es.generated_tokens);
  m["rollout/prefill_tokens_computed"] = double(es.prefill_tokens_computed);
  m["rollout/prompt_tokens_served"] = double(es.prompt_tokens_served);
  m["rollout/prefix_cache_hit_rate"] =
      es.prefix_query_tokens ? double(es.prefix_hit_tokens) / double(es.prefix_query_tokens) : 0.0;
  m["rollout/preemptions"] = double(es.preemptions);
  if (es.prefill_wall_s > 0 && es.decode_wall_s > 0) {  // prefill/decode disaggregation (rollout.prefill_ranks)
    m["rollout/pd_prefill_busy"] = es.prefill_busy_s / es.prefill_wall_s;
    m["rollout/pd_decode_busy"] = es.decode_busy_s / es.decode_wall_s;
    m["perf/kv_transfer_bytes"] = double(es.kv_sent_bytes);
    m["perf/kv_transfer_tokens"] = double(es.kv_sent_tokens);
    m["perf/kv_taken_tokens"] = double(es.kv_received_tokens);  // (a shared transfer once per turn that took it)
    m["perf/kv_transfer_send_s"] = es.kv_send_s;
    m["perf/kv_transfer_receive_s"] = es.kv_receive_s;
  }
  if (es.spec_passes > 0) {  // speculative decoding (rollout.speculative)
    m["rollout/spec_accept_rate"] = double(es.spec_accepted) / double(std::max<int64_t>(es.spec_drafted, 1));
    // tokens a verify pass adds: its accepted drafts and the one the policy adds
    m["rollout/spec_accept_length"] = double(es.spec_accepted + es.spec_passes) / double(es.spec_passes);
    for (int j = 0; j < EngineStats::kMaxSpecSteps; ++j)
      if (es.spec_offered_at[j] > 0)
        m[fmt::format("rollout/spec_accept_rate_step{}", j + 1)] =
            double(es.spec_accepted_at[j]) / double(es.spec_offered_at[j]);
    // a hybrid model: tokens computed again after a rejected draft (their state restored)
    if (es.spec_state_restores > 0) m["rollout/spec_recomputed_tokens"] = double(es.spec_recomputed_tokens);
  }
}

void add_episode_metrics(const std::vector<Sample>& first, const std::vector<Sample>& second,
                         std::map<std::string, double>& m) {
  double n = 0, turns = 0, calls = 0, env_s = 0, episode_s = 0, failed = 0, model_tokens = 0, tokens = 0;
  double errors[5] = {};
  std::map<std::string, std::pair<double, double>> env_metrics;  // name -> (sum, episodes that report it)
  auto add = [&](const Sample& s) {
    if (s.status == SampleStatus::Baseline || (s.env_turns == 0 && s.status != SampleStatus::EnvFailed)) return;
    n += 1;
    for (const auto& [name, value] : s.env_metrics) {
      env_metrics[name].first += value;
      env_metrics[name].second += 1;
    }
    turns += s.env_turns;
    calls += s.env_tool_calls;
    env_s += s.env_s;
    episode_s += s.episode_s;
    failed += s.status == SampleStatus::EnvFailed;
    if (s.env_error >= 0 && s.env_error < 5) errors[s.env_error] += 1;
    if (s.status == SampleStatus::EnvFailed) return;  // never trained: its model tokens are not counted
    tokens += double(s.response_length());
    for (float x : s.loss_mask) model_tokens += x;
  };
  for (const Sample& s : first) add(s);
  for (const Sample& s : second) add(s);
  if (n == 0) return;
  m["rollout/env_turns/mean"] = turns / n;
  m["rollout/env_tool_calls/mean"] = calls / n;
  m["rollout/env_failed"] = failed;
  for (int c = 1; c < 5; ++c) m[fmt::format("rollout/env_error/{}", env_error_name(EnvError(c)))] = errors[c];
  m["rollout/env_model_token_fraction"] = tokens > 0 ? model_tokens / tokens : 0.0;
  m["perf/env_wait_time_fraction"] = episode_s > 0 ? env_s / episode_s : 0.0;
  for (const auto& [name, sum_count] : env_metrics)
    m["rollout/env_metrics/" + name] = sum_count.first / sum_count.second;
}

std::map<std::string, double> rollout_metrics(const RolloutBatch& batch, const RolloutMetricsInputs& in) {
  const std::vector<Sample>& kept = batch.kept;
  const double n = std::max<double>(1, double(kept.size()));
  double raw = 0, rew = 0, stale_sum = 0, stale_max = 0;
  for (const Sample& s : kept) {
    raw += s.raw_reward;
    rew += s.reward;
    // Versions behind the trainer's: the oldest token of each trained sample.
    const int64_t oldest =
        s.weight_versions.empty() ? in.step : *std::min_element(s.weight_versions.begin(), s.weight_versions.end());
    stale_sum += double(in.step - oldest);
    stale_max = std::max(stale_max, double(in.step - oldest));
  }
  const int64_t k = in.n_samples_per_prompt;
  const int64_t kept_groups = int64_t(kept.size()) / k;
  int64_t zero_std = 0;
  for (int64_t g = 0; g < kept_groups; ++g) {
    bool same = true;
    for (int64_t i = 1; i < k; ++i) same &= kept[g * k + i].raw_reward == kept[g * k].raw_reward;
    zero_std += same;
  }
  const EngineStats& es = batch.engine_stats;
  std::map<std::string, double> m;
  m["rollout/raw_reward"] = raw / n;
  m["rollout/rewards"] = rew / n;
  add_response_metrics(kept, m);
  m["rollout/zero_std/count"] = double(zero_std);
  m["rollout/dynamic_filter/drop_zero_std"] = double(batch.groups_dropped);
  m["rollout/short_batch_groups"] = double(std::max<int64_t>(0, in.rollout_batch_size - kept_groups));
  m["rollout/groups_generated"] = double(batch.groups_generated);
  m["rollout/sampling_rounds"] = double(batch.rounds);
  add_engine_metrics(es, m);
  m["rollout/skipped_lines"] = double(in.skipped_lines);
  m["rollout/prompt_cursor"] = double(in.prompt_cursor);
  m["rollout/epoch"] = double(in.epoch);
  m["perf/reward_score_time"] = batch.score_s;
  if (batch.teacher_s > 0) m["perf/teacher_time"] = batch.teacher_s;
  if (batch.tail_s >= 0) m["perf/rollout_tail_time"] = batch.tail_s;
  if (batch.generate_s > 0) m["perf/rollout_tokens_per_s"] = double(es.generated_tokens) / batch.generate_s;
  if (es.iterations > 0) m["perf/engine_iteration_s"] = (es.forward_s + es.sample_s) / double(es.iterations);
  double greedy = 0, n_greedy = 0;  // ReMax: the greedy baselines of the batch's groups
  for (const Sample& s : batch.unused)
    if (s.status == SampleStatus::Baseline) greedy += s.raw_reward, n_greedy += 1;
  if (n_greedy > 0) m["rollout/remax_greedy_reward"] = greedy / n_greedy;
  add_episode_metrics(batch.kept, batch.unused, m);
  m["rollout/staleness/mean"] = stale_sum / n;
  m["rollout/staleness/max"] = stale_max;
  return m;
}

}  // namespace slimpi
