#include "io/rollout_log.h"

#include <slimpi/error.h>
#include <slimpi/version.h>

#include <algorithm>

#include "io/h5_meta.h"

namespace slimpi {

RolloutLog RolloutLog::create(const std::string& path, MPI_Comm comm, const std::string& deck_text) {
  RolloutLog log;
  log.file_ = h5::File::create(path, comm);
  h5::write_file_meta(log.file_, "slimpi rollouts", deck_text);
  log.group_ = h5::create_group(log.file_.id(), "samples");
  h5::write_attr(log.group_.id(), "status_names",
                 std::string("0 pending, 1 completed, 2 truncated, 3 aborted (over-sampling surplus), 4 failed, "
                             "5 filtered (dynamic filter)"));
  log.bind(/*create=*/true);
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
  col(prompt_length_, "prompt_length");
  col(response_length_, "response_length");
  col(reward_, "reward");
  col(raw_reward_, "raw_reward");
  col(advantage_, "advantage");
  col(status_, "status");
  col(tokens_, "tokens");
  col(log_probs_, "rollout_log_probs");
  col(advantages_, "advantages");
}

uint64_t RolloutLog::append(const std::vector<Sample>& local) {
  const size_t n = local.size();
  std::vector<int64_t> step(n), group(n), index(n), version(n), token_lengths(n), logp_lengths(n);
  std::vector<int32_t> prompt_len(n), response_len(n), tokens;
  std::vector<float> reward(n), raw(n), advantage(n), logp, adv_values;
  std::vector<int64_t> adv_lengths(n);
  std::vector<int8_t> status(n);
  for (size_t i = 0; i < n; ++i) {
    const Sample& s = local[i];
    SLIMPI_CHECK(s.rollout_log_probs.empty() || s.rollout_log_probs.size() == s.response_tokens.size(),
                 "sample (step {}, group {}, index {}) has {} log-probs for {} response tokens", s.step,
                 s.group_index, s.index, s.rollout_log_probs.size(), s.response_tokens.size());
    step[i] = s.step;
    group[i] = s.group_index;
    index[i] = s.index;
    version[i] = s.weight_version;
    prompt_len[i] = static_cast<int32_t>(s.prompt_tokens.size());
    response_len[i] = static_cast<int32_t>(s.response_tokens.size());
    reward[i] = s.reward;
    raw[i] = s.raw_reward;
    advantage[i] = s.advantage;
    status[i] = static_cast<int8_t>(s.status);
    tokens.insert(tokens.end(), s.prompt_tokens.begin(), s.prompt_tokens.end());
    tokens.insert(tokens.end(), s.response_tokens.begin(), s.response_tokens.end());
    token_lengths[i] = prompt_len[i] + response_len[i];
    logp.insert(logp.end(), s.rollout_log_probs.begin(), s.rollout_log_probs.end());
    logp_lengths[i] = static_cast<int64_t>(s.rollout_log_probs.size());
    adv_values.insert(adv_values.end(), s.advantages.begin(), s.advantages.end());
    adv_lengths[i] = static_cast<int64_t>(s.advantages.size());
  }
  const uint64_t first = step_.append(step.data(), n);
  group_index_.append(group.data(), n);
  index_.append(index.data(), n);
  weight_version_.append(version.data(), n);
  prompt_length_.append(prompt_len.data(), n);
  response_length_.append(response_len.data(), n);
  reward_.append(reward.data(), n);
  raw_reward_.append(raw.data(), n);
  advantage_.append(advantage.data(), n);
  status_.append(status.data(), n);
  tokens_.append(tokens.data(), token_lengths.data(), n);
  log_probs_.append(logp.data(), logp_lengths.data(), n);
  advantages_.append(adv_values.data(), adv_lengths.data(), n);
  return first;
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
  for (auto* d : {&prompt_length_, &response_length_}) d->truncate_to(keep);
  for (auto* d : {&reward_, &raw_reward_, &advantage_}) d->truncate_to(keep);
  status_.truncate_to(keep);
  tokens_.truncate_to(keep);
  log_probs_.truncate_to(keep);
  advantages_.truncate_to(keep);
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
  auto step = step_.read(first, count), group = group_index_.read(first, count);
  auto index = index_.read(first, count), version = weight_version_.read(first, count);
  auto prompt_len = prompt_length_.read(first, count), response_len = response_length_.read(first, count);
  auto reward = reward_.read(first, count), raw = raw_reward_.read(first, count);
  auto advantage = advantage_.read(first, count);
  auto status = status_.read(first, count);
  auto tok_off = tokens_.read_offsets(), lp_off = log_probs_.read_offsets(), adv_off = advantages_.read_offsets();
  auto tok = tokens_.read_values();
  auto lp = log_probs_.read_values();
  auto adv = advantages_.read_values();
  std::vector<Sample> out(count);
  for (size_t k = 0; k < out.size(); ++k) {
    const size_t i = first + k;
    Sample& s = out[k];
    s.step = step[k];
    s.group_index = group[k];
    s.index = index[k];
    s.weight_version = version[k];
    s.reward = reward[k];
    s.raw_reward = raw[k];
    s.advantage = advantage[k];
    s.status = static_cast<SampleStatus>(status[k]);
    SLIMPI_CHECK(tok_off[i + 1] - tok_off[i] == prompt_len[k] + response_len[k],
                 "rollouts.h5 row {}: tokens row has {} ids, lengths say {} + {}", i, tok_off[i + 1] - tok_off[i],
                 prompt_len[k], response_len[k]);
    auto t0 = tok.begin() + tok_off[i];
    s.prompt_tokens.assign(t0, t0 + prompt_len[k]);
    s.response_tokens.assign(t0 + prompt_len[k], tok.begin() + tok_off[i + 1]);
    s.rollout_log_probs.assign(lp.begin() + lp_off[i], lp.begin() + lp_off[i + 1]);
    s.advantages.assign(adv.begin() + adv_off[i], adv.begin() + adv_off[i + 1]);
  }
  return out;
}

}  // namespace slimpi
