#include "io/rollout_log.h"

#include <slimpi/error.h>
#include <slimpi/version.h>

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "io/h5_meta.h"

namespace slimpi {

RolloutLog RolloutLog::create(const std::string& path, MPI_Comm comm, const std::string& deck_text) {
  RolloutLog log;
  log.file_ = h5::File::create(path, comm);
  h5::write_file_meta(log.file_, "slimpi rollouts", deck_text);
  log.group_ = h5::create_group(log.file_.id(), "samples");
  h5::write_attr(log.group_.id(), "status_names",
                 std::string("0 pending, 1 completed, 2 truncated, 3 aborted (over-sampling surplus), 4 failed, "
                             "5 filtered (dynamic filter), 6 stale (beyond rollout.max_staleness), 7 baseline (ReMax's greedy "
                             "response, not trained), 8 env_failed (the environment failed the episode; its group is "
                             "not trained)"));
  log.bind(/*create=*/true);
  h5::write_attr(log.env_error_.id(), "env_error_names",
                 std::string("0 none, 1 model, 2 tool, 3 infra, 4 overlong"));
  return log;
}

RolloutLog RolloutLog::open(const std::string& path, MPI_Comm comm, bool writable) {
  RolloutLog log;
  log.file_ = h5::File::open(path, writable, comm);
  log.group_ = h5::open_group(log.file_.id(), "samples");
  log.bind(/*create=*/false);
  return log;
}

void RolloutLog::bind(bool create) {
  hid_t g = group_.id();
  auto col = [&](auto& d, const char* name) {
    using D = std::decay_t<decltype(d)>;
    d = create ? D::create(file_, g, name) : D::open(file_, g, name);
  };
  col(step_, "step");
  col(group_index_, "group_index");
  col(index_, "index");
  col(weight_version_, "weight_version");
  has_version_max_ = create || h5::exists(g, "weight_version_max");
  if (has_version_max_) col(weight_version_max_, "weight_version_max");
  col(prompt_length_, "prompt_length");
  col(response_length_, "response_length");
  has_spec_ = create || h5::exists(g, "spec_drafted");
  if (has_spec_) {
    col(spec_drafted_, "spec_drafted");
    col(spec_accepted_, "spec_accepted");
    col(spec_passes_, "spec_verify_passes");
  }
  has_env_ = create || h5::exists(g, "env_turns");
  if (has_env_) {
    col(env_turns_, "env_turns");
    col(env_tool_calls_, "env_tool_calls");
    col(env_time_s_, "env_time_s");
    col(episode_time_s_, "episode_time_s");
    col(env_error_, "env_error");
  }
  has_env_metrics_ = create || h5::exists(g, "env_metrics");
  if (has_env_metrics_) col(env_metrics_, "env_metrics");
  has_context_starts_ = create || h5::exists(g, "context_starts");
  if (has_context_starts_) col(context_starts_, "context_starts");
  col(reward_, "reward");
  col(raw_reward_, "raw_reward");
  col(advantage_, "advantage");
  col(status_, "status");
  col(tokens_, "tokens");
  col(sampling_support_, "sampling_support");
  col(weight_versions_, "weight_versions");
  // Files written before routing traces existed have no routing column: they go on
  // without one (their runs are dense; a routed sample appended to them is refused).
  has_routing_ = create || h5::exists(g, "routing");
  if (has_routing_) col(routing_, "routing");
  token_columns_.clear();
  token_columns_.reserve(10);
  for (auto [name, field] : {std::pair{"rollout_log_probs", &Sample::rollout_log_probs},
                             {"old_log_probs", &Sample::old_log_probs},
                             {"ref_log_probs", &Sample::ref_log_probs},
                             {"kl", &Sample::kl},
                             {"raw_advantages", &Sample::raw_advantages},
                             {"advantages", &Sample::advantages},
                             {"loss_mask", &Sample::loss_mask},
                             {"values", &Sample::values},
                             {"returns", &Sample::returns},
                             {"teacher_log_probs", &Sample::teacher_log_probs}}) {
    // Files from before loss masks (values, returns, teacher log-probs) were recorded go on
    // without that column.
    const bool newer = std::string(name) == "loss_mask" || std::string(name) == "values" ||
                       std::string(name) == "returns" || std::string(name) == "teacher_log_probs";
    if (!create && newer && !h5::exists(g, name)) continue;
    token_columns_.push_back(TokenColumn{name, field, {}});
    col(token_columns_.back().data, name);
  }
}

namespace {

// One per-token field of every sample (CSR values + row lengths), checking that each
// row is empty or holds one value per response token.
template <class T>
void gather_token_field(const std::vector<const Sample*>& rows, const std::vector<T> Sample::*field, const char* name,
                        std::vector<T>& values, std::vector<int64_t>& lengths) {
  for (const Sample* s : rows) {
    const std::vector<T>& v = s->*field;
    SLIMPI_CHECK(v.empty() || int64_t(v.size()) == s->response_length(),
                 "sample (step {}, group {}, index {}) has {} {} for {} response tokens", s->step, s->group_index,
                 s->index, v.size(), name, s->response_length());
    values.insert(values.end(), v.begin(), v.end());
    lengths.push_back(static_cast<int64_t>(v.size()));
  }
}

// A per-sample vector field as a CSR column's values (converted to V) and row lengths. A
// file without the column (has_column false) takes only empty rows: `refusal` otherwise.
template <typename V, typename T>
void gather_rows(const std::vector<const Sample*>& rows, const std::vector<T> Sample::*field, bool has_column,
                 const char* refusal, std::vector<V>& values, std::vector<int64_t>& lengths) {
  for (const Sample* s : rows) {
    const std::vector<T>& v = s->*field;
    SLIMPI_CHECK(has_column || v.empty(), "{}", refusal);
    values.insert(values.end(), v.begin(), v.end());
    lengths.push_back(static_cast<int64_t>(v.size()));
  }
}

// Values of a CSR column per part: [n values of part 0, of part 1].
std::vector<uint64_t> values_per_part(const std::vector<int64_t>& lengths, size_t n_first) {
  std::vector<uint64_t> out(2, 0);
  for (size_t i = 0; i < lengths.size(); ++i) out[i < n_first ? 0 : 1] += uint64_t(lengths[i]);
  return out;
}

}  // namespace

// One value per sample: the fixed-size columns of rollouts.h5, in row order.
struct RolloutLog::RowColumns {
  std::vector<int64_t> step, group, index, version, version_max;
  std::vector<int32_t> prompt_len, response_len, drafted, accepted, passes, env_turns, env_calls;
  std::vector<float> reward, raw, advantage, env_s, episode_s;
  std::vector<int8_t> status, env_error;

  explicit RowColumns(const std::vector<const Sample*>& rows) {
    for (const Sample* p : rows) {
      const Sample& s = *p;
      env_turns.push_back(s.env_turns);
      env_calls.push_back(s.env_tool_calls);
      env_s.push_back(s.env_s);
      episode_s.push_back(s.episode_s);
      env_error.push_back(s.env_error);
      step.push_back(s.step);
      group.push_back(s.group_index);
      index.push_back(s.index);
      version.push_back(s.weight_version());
      version_max.push_back(s.weight_versions.empty() ? version.back() : s.weight_versions.back());
      prompt_len.push_back(static_cast<int32_t>(s.prompt_length));
      response_len.push_back(static_cast<int32_t>(s.response_length()));
      drafted.push_back(s.spec_drafted);
      accepted.push_back(s.spec_accepted);
      passes.push_back(s.spec_passes);
      reward.push_back(s.reward);
      raw.push_back(s.raw_reward);
      advantage.push_back(s.advantages.empty() ? (std::isnan(s.reward) ? NAN : 0.0f) : s.advantages.front());
      status.push_back(static_cast<int8_t>(s.status));
    }
  }
};

// The variable-length columns (CSR values and row lengths), in row order.
struct RolloutLog::CsrColumns {
  std::vector<int32_t> tokens, support, contexts;
  std::vector<int64_t> token_lengths, versions, support_lengths, version_lengths, routing_lengths, metrics_lengths,
      context_lengths;
  std::vector<int16_t> routing;
  std::vector<uint8_t> metrics_text;  // the environment's metrics: one JSON object per row, as bytes ("" none)
  std::vector<std::vector<float>> column_values;  // per TokenColumn
  std::vector<std::vector<int64_t>> column_lengths;
};

RolloutLog::CsrColumns RolloutLog::gather_csr(const std::vector<const Sample*>& rows) const {
  CsrColumns c;
  for (const Sample* s : rows) {
    c.tokens.insert(c.tokens.end(), s->tokens.begin(), s->tokens.end());
    c.token_lengths.push_back(static_cast<int64_t>(s->tokens.size()));
  }
  gather_token_field(rows, &Sample::sampling_support, "sampling_support", c.support, c.support_lengths);
  gather_token_field(rows, &Sample::weight_versions, "weight_versions", c.versions, c.version_lengths);
  gather_rows(rows, &Sample::routing, has_routing_,
              "this rollouts.h5 was written before routing traces existed and cannot hold them", c.routing,
              c.routing_lengths);
  for (const Sample* s : rows) {
    const std::string text = s->env_metrics.empty() ? std::string() : nlohmann::json(s->env_metrics).dump();
    c.metrics_text.insert(c.metrics_text.end(), text.begin(), text.end());
    c.metrics_lengths.push_back(static_cast<int64_t>(text.size()));
  }
  gather_rows(rows, &Sample::context_starts, has_context_starts_,
              "this rollouts.h5 was written before split trajectories were recorded and cannot hold them", c.contexts,
              c.context_lengths);
  c.column_values.resize(token_columns_.size());
  c.column_lengths.resize(token_columns_.size());
  for (size_t k = 0; k < token_columns_.size(); ++k)
    gather_token_field(rows, token_columns_[k].field, token_columns_[k].name, c.column_values[k],
                       c.column_lengths[k]);
  return c;
}

void RolloutLog::append(const std::vector<Sample>& first, const std::vector<Sample>& second) {
  std::vector<const Sample*> rows;
  for (const Sample& s : first) rows.push_back(&s);
  for (const Sample& s : second) rows.push_back(&s);
  const RowColumns r(rows);
  const CsrColumns c = gather_csr(rows);
  // One exchange of counts for every dataset: rows, then each CSR column's values.
  std::vector<std::vector<uint64_t>> counts{{first.size(), second.size()},
                                            values_per_part(c.token_lengths, first.size()),
                                            values_per_part(c.support_lengths, first.size()),
                                            values_per_part(c.version_lengths, first.size()),
                                            values_per_part(c.routing_lengths, first.size())};
  // (Every rank counts the routing column, with or without one: the plan lines up.)
  for (const auto& l : c.column_lengths) counts.push_back(values_per_part(l, first.size()));
  counts.push_back(values_per_part(c.metrics_lengths, first.size()));
  counts.push_back(values_per_part(c.context_lengths, first.size()));
  const std::vector<h5::AppendPlan> plan = h5::plan_appends(file_.comm(), counts);
  append_rows(r, plan[0]);
  append_csr(c, plan);
  if (!has_env_metrics_ && !said_no_metrics_column_ &&
      std::any_of(rows.begin(), rows.end(), [](const Sample* s) { return !s->env_metrics.empty(); })) {
    said_no_metrics_column_ = true;
    log::warn("this rollouts.h5 was written before the environment's metrics were recorded: they are not stored "
              "in it (metrics.h5's rollout/env_metrics/* has them)");
  }
}

void RolloutLog::append_rows(const RowColumns& r, const h5::AppendPlan& row_plan) {
  step_.append(r.step.data(), row_plan);
  group_index_.append(r.group.data(), row_plan);
  index_.append(r.index.data(), row_plan);
  weight_version_.append(r.version.data(), row_plan);
  if (has_version_max_) weight_version_max_.append(r.version_max.data(), row_plan);
  prompt_length_.append(r.prompt_len.data(), row_plan);
  response_length_.append(r.response_len.data(), row_plan);
  if (has_spec_) {
    spec_drafted_.append(r.drafted.data(), row_plan);
    spec_accepted_.append(r.accepted.data(), row_plan);
    spec_passes_.append(r.passes.data(), row_plan);
  }
  if (has_env_) {
    env_turns_.append(r.env_turns.data(), row_plan);
    env_tool_calls_.append(r.env_calls.data(), row_plan);
    env_time_s_.append(r.env_s.data(), row_plan);
    episode_time_s_.append(r.episode_s.data(), row_plan);
    env_error_.append(r.env_error.data(), row_plan);
  }
  reward_.append(r.reward.data(), row_plan);
  raw_reward_.append(r.raw.data(), row_plan);
  advantage_.append(r.advantage.data(), row_plan);
  status_.append(r.status.data(), row_plan);
}

void RolloutLog::append_csr(const CsrColumns& c, const std::vector<h5::AppendPlan>& plan) {
  const h5::AppendPlan& row_plan = plan[0];
  tokens_.append(c.tokens.data(), c.token_lengths.data(), row_plan, plan[1]);
  sampling_support_.append(c.support.data(), c.support_lengths.data(), row_plan, plan[2]);
  weight_versions_.append(c.versions.data(), c.version_lengths.data(), row_plan, plan[3]);
  if (has_routing_) routing_.append(c.routing.data(), c.routing_lengths.data(), row_plan, plan[4]);
  for (size_t k = 0; k < token_columns_.size(); ++k)
    token_columns_[k].data.append(c.column_values[k].data(), c.column_lengths[k].data(), row_plan, plan[5 + k]);
  if (has_env_metrics_)
    env_metrics_.append(c.metrics_text.data(), c.metrics_lengths.data(), row_plan, plan[5 + token_columns_.size()]);
  if (has_context_starts_)
    context_starts_.append(c.contexts.data(), c.context_lengths.data(), row_plan, plan[6 + token_columns_.size()]);
}

std::pair<uint64_t, uint64_t> RolloutLog::step_rows(int64_t step) const {
  const std::vector<int64_t> steps = step_.read();  // non-decreasing
  auto lo = std::lower_bound(steps.begin(), steps.end(), step);
  auto hi = std::upper_bound(lo, steps.end(), step);
  return {uint64_t(lo - steps.begin()), uint64_t(hi - steps.begin())};
}

uint64_t RolloutLog::truncate_to_step(int64_t step) {
  const uint64_t keep = step_rows(step).first;
  for (auto* d : {&step_, &group_index_, &index_, &weight_version_}) d->truncate_to(keep);
  if (has_version_max_) weight_version_max_.truncate_to(keep);
  for (auto* d : {&prompt_length_, &response_length_}) d->truncate_to(keep);
  if (has_spec_)
    for (auto* d : {&spec_drafted_, &spec_accepted_, &spec_passes_}) d->truncate_to(keep);
  if (has_env_) {
    for (auto* d : {&env_turns_, &env_tool_calls_}) d->truncate_to(keep);
    for (auto* d : {&env_time_s_, &episode_time_s_}) d->truncate_to(keep);
    env_error_.truncate_to(keep);
  }
  if (has_env_metrics_) env_metrics_.truncate_to(keep);
  if (has_context_starts_) context_starts_.truncate_to(keep);
  for (auto* d : {&reward_, &raw_reward_, &advantage_}) d->truncate_to(keep);
  status_.truncate_to(keep);
  tokens_.truncate_to(keep);
  sampling_support_.truncate_to(keep);
  weight_versions_.truncate_to(keep);
  if (has_routing_) routing_.truncate_to(keep);
  for (auto& c : token_columns_) c.data.truncate_to(keep);
  file_.flush();
  return keep;
}

std::vector<Sample> RolloutLog::read_all() const { return read_rows(0, n_samples()); }

std::vector<Sample> RolloutLog::read_trained(int64_t step) const {
  auto [first, last] = step_rows(step);
  std::vector<Sample> rows = read_rows(first, last - first);
  std::vector<Sample> trained;
  for (auto& s : rows)
    if (s.status == SampleStatus::Completed || s.status == SampleStatus::Truncated) trained.push_back(std::move(s));
  return trained;
}

std::vector<Sample> RolloutLog::read_rows(uint64_t first, uint64_t count) const {
  std::vector<Sample> out(count);
  const std::vector<int32_t> response_len = read_fixed_columns(first, out);
  read_csr_columns(first, response_len, out);
  return out;
}

std::vector<int32_t> RolloutLog::read_fixed_columns(uint64_t first, std::vector<Sample>& out) const {
  const uint64_t count = out.size();
  auto step = step_.read(first, count), group = group_index_.read(first, count);
  auto index = index_.read(first, count);
  auto prompt_len = prompt_length_.read(first, count), response_len = response_length_.read(first, count);
  const std::vector<int32_t> none(count, 0);
  auto drafted = has_spec_ ? spec_drafted_.read(first, count) : none;
  auto accepted = has_spec_ ? spec_accepted_.read(first, count) : none;
  auto passes = has_spec_ ? spec_passes_.read(first, count) : none;
  auto reward = reward_.read(first, count), raw = raw_reward_.read(first, count);
  auto status = status_.read(first, count);
  auto turns = has_env_ ? env_turns_.read(first, count) : none;
  auto calls = has_env_ ? env_tool_calls_.read(first, count) : none;
  const std::vector<float> zeros(count, 0.0f);
  auto env_s = has_env_ ? env_time_s_.read(first, count) : zeros;
  auto episode_s = has_env_ ? episode_time_s_.read(first, count) : zeros;
  auto env_error = has_env_ ? env_error_.read(first, count) : std::vector<int8_t>(count, 0);
  for (size_t k = 0; k < out.size(); ++k) {
    Sample& s = out[k];
    s.step = step[k];
    s.group_index = group[k];
    s.index = index[k];
    s.reward = reward[k];
    s.raw_reward = raw[k];
    s.status = static_cast<SampleStatus>(status[k]);
    s.prompt_length = prompt_len[k];
    s.spec_drafted = drafted[k];
    s.spec_accepted = accepted[k];
    s.spec_passes = passes[k];
    s.env_turns = turns[k];
    s.env_tool_calls = calls[k];
    s.env_s = env_s[k];
    s.episode_s = episode_s[k];
    s.env_error = env_error[k];
  }
  return response_len;
}

void RolloutLog::read_csr_columns(uint64_t first, const std::vector<int32_t>& response_len,
                                  std::vector<Sample>& out) const {
  const uint64_t count = out.size();
  // Each CSR column: its offsets whole (8 bytes a row), its values only for these rows;
  // row_of indexes them from the first row's offset.
  auto tok_off = tokens_.read_offsets(), sup_off = sampling_support_.read_offsets();
  auto ver_off = weight_versions_.read_offsets();
  auto tok = tokens_.read_values(tok_off, first, count);
  auto sup = sampling_support_.read_values(sup_off, first, count);
  auto ver = weight_versions_.read_values(ver_off, first, count);
  const std::vector<int64_t> no_rows(n_samples() + 1, 0);  // the offsets of a column the file lacks
  const std::vector<int64_t> rout_off = has_routing_ ? routing_.read_offsets() : no_rows;
  const std::vector<int16_t> rout = has_routing_ ? routing_.read_values(rout_off, first, count) : std::vector<int16_t>();
  const std::vector<int64_t> met_off = has_env_metrics_ ? env_metrics_.read_offsets() : no_rows;
  const std::vector<uint8_t> met = has_env_metrics_ ? env_metrics_.read_values(met_off, first, count) : std::vector<uint8_t>();
  const std::vector<int64_t> ctx_off = has_context_starts_ ? context_starts_.read_offsets() : no_rows;
  const std::vector<int32_t> ctx =
      has_context_starts_ ? context_starts_.read_values(ctx_off, first, count) : std::vector<int32_t>();
  std::vector<std::vector<int64_t>> col_off;
  std::vector<std::vector<float>> col_values;
  for (const auto& c : token_columns_) {
    col_off.push_back(c.data.read_offsets());
    col_values.push_back(c.data.read_values(col_off.back(), first, count));
  }
  auto row_of = [&](const auto& values, const std::vector<int64_t>& offsets, size_t i) {
    using V = typename std::decay_t<decltype(values)>::value_type;
    return std::vector<V>(values.begin() + (offsets[i] - offsets[first]), values.begin() + (offsets[i + 1] - offsets[first]));
  };
  for (size_t k = 0; k < out.size(); ++k) {
    const size_t i = first + k;
    Sample& s = out[k];
    SLIMPI_CHECK(tok_off[i + 1] - tok_off[i] == s.prompt_length + response_len[k],
                 "rollouts.h5 row {}: tokens row has {} ids, lengths say {} + {}", i, tok_off[i + 1] - tok_off[i],
                 s.prompt_length, response_len[k]);
    const std::vector<int32_t> ids = row_of(tok, tok_off, i);
    s.tokens.assign(ids.begin(), ids.end());
    s.sampling_support = row_of(sup, sup_off, i);
    s.weight_versions = row_of(ver, ver_off, i);
    s.routing = row_of(rout, rout_off, i);
    const std::vector<int32_t> starts = row_of(ctx, ctx_off, i);
    s.context_starts.assign(starts.begin(), starts.end());
    if (met_off[i + 1] > met_off[i]) {
      const std::vector<uint8_t> text = row_of(met, met_off, i);
      const nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
      SLIMPI_CHECK(j.is_object(), "rollouts.h5 row {}: env_metrics is not a JSON object", i);
      s.env_metrics = j.get<std::map<std::string, double>>();
    }
    for (size_t c = 0; c < token_columns_.size(); ++c) s.*(token_columns_[c].field) = row_of(col_values[c], col_off[c], i);
  }
}

}  // namespace slimpi
