#include "rollout/context_threads.h"

#include <slimpi/error.h>

#include <algorithm>

namespace slimpi {
namespace {

// One context's tokens and, per token, the rollout fields (the prompt's tokens have none:
// zeros, dropped again when the sample is rebuilt).
struct ContextView {
  std::vector<int64_t> tokens;
  std::vector<float> loss_mask, log_probs;
  std::vector<int64_t> versions;
  std::vector<int32_t> support;
};

ContextView view_of(const Sample& s, size_t c) {
  const int64_t P = s.prompt_length, R = s.response_length();
  const auto& starts = s.context_starts;
  const int64_t begin = c == 0 ? -P : starts[c - 1], end = c == starts.size() ? R : starts[c];  // response offsets
  ContextView v;
  v.tokens.assign(s.tokens.begin() + P + begin, s.tokens.begin() + P + end);
  const int64_t pad = std::max<int64_t>(0, -begin), from = std::max<int64_t>(0, begin);
  v.loss_mask.assign(size_t(pad), 0.0f);
  v.log_probs.assign(size_t(pad), 0.0f);
  v.versions.assign(size_t(pad), 0);
  v.support.assign(size_t(pad), 0);
  v.loss_mask.insert(v.loss_mask.end(), s.loss_mask.begin() + from, s.loss_mask.begin() + end);
  v.log_probs.insert(v.log_probs.end(), s.rollout_log_probs.begin() + from, s.rollout_log_probs.begin() + end);
  v.versions.insert(v.versions.end(), s.weight_versions.begin() + from, s.weight_versions.begin() + end);
  if (s.sampling_support.empty()) v.support.resize(v.tokens.size(), 0);
  else v.support.insert(v.support.end(), s.sampling_support.begin() + from, s.sampling_support.begin() + end);
  return v;
}

template <typename T>
void overwrite_prefix(std::vector<T>& to, const std::vector<T>& from) {
  std::copy(from.begin(), from.end(), to.begin());
}

template <typename T>
void append_from(std::vector<T>& to, const std::vector<T>& from, int64_t skip) {
  to.insert(to.end(), from.begin() + skip, from.end());
}

}  // namespace

void join_resumed_contexts(Sample& s, const std::vector<int64_t>& continued_from) {
  const size_t n = s.context_starts.size() + 1;
  const size_t R = size_t(s.response_length());
  SLIMPI_CHECK(continued_from.size() <= n, "sample (step {}, group {}, index {}): {} context links for {} contexts",
               s.step, s.group_index, s.index, continued_from.size(), n);
  if (std::none_of(continued_from.begin(), continued_from.end(), [](int64_t p) { return p >= 0; })) return;
  SLIMPI_CHECK(s.routing.empty() && s.loss_mask.size() == R && s.rollout_log_probs.size() == R &&
                   s.weight_versions.size() == R && (s.sampling_support.empty() || s.sampling_support.size() == R),
               "sample (step {}, group {}, index {}): its rollout fields are not complete for {} response tokens, or it "
               "has a routing trace", s.step, s.group_index, s.index, R);
  std::vector<ContextView> views;
  for (size_t c = 0; c < n; ++c) views.push_back(view_of(s, c));
  std::vector<size_t> root(n);
  std::vector<bool> continued(n, false);
  for (size_t c = 0; c < n; ++c) {
    root[c] = c;
    const int64_t p = c < continued_from.size() ? continued_from[c] : -1;
    if (p < 0) continue;
    const ContextView& from = views[size_t(p)];
    ContextView& to = views[c];
    SLIMPI_CHECK(size_t(p) < c && !continued[size_t(p)] && from.tokens.size() <= to.tokens.size() &&
                     std::equal(from.tokens.begin(), from.tokens.end(), to.tokens.begin()),
                 "sample (step {}, group {}, index {}): context {} does not continue context {} (an earlier context "
                 "not yet continued, whose tokens it begins with)", s.step, s.group_index, s.index, c, p);
    overwrite_prefix(to.loss_mask, from.loss_mask);
    overwrite_prefix(to.log_probs, from.log_probs);
    overwrite_prefix(to.versions, from.versions);
    overwrite_prefix(to.support, from.support);
    continued[size_t(p)] = true;
    root[c] = root[size_t(p)];
  }
  std::vector<size_t> kept;  // each thread's last context, in the order of the threads' first
  for (size_t c = 0; c < n; ++c)
    if (!continued[c]) kept.push_back(c);
  std::stable_sort(kept.begin(), kept.end(), [&](size_t a, size_t b) { return root[a] < root[b]; });
  SLIMPI_CHECK(root[kept.front()] == 0, "sample (step {}, group {}, index {}): no thread holds its prompt", s.step,
               s.group_index, s.index);

  const int64_t P = s.prompt_length;
  const bool had_support = !s.sampling_support.empty();
  s.tokens.resize(size_t(P));  // the prompt: the first thread's view begins with it
  s.loss_mask.clear();
  s.rollout_log_probs.clear();
  s.weight_versions.clear();
  s.sampling_support.clear();
  s.context_starts.clear();
  for (size_t i = 0; i < kept.size(); ++i) {
    const ContextView& v = views[kept[i]];
    const int64_t skip = i == 0 ? P : 0;
    if (i > 0) s.context_starts.push_back(int64_t(s.tokens.size()) - P);
    append_from(s.tokens, v.tokens, skip);
    append_from(s.loss_mask, v.loss_mask, skip);
    append_from(s.rollout_log_probs, v.log_probs, skip);
    append_from(s.weight_versions, v.versions, skip);
    append_from(s.sampling_support, v.support, skip);
  }
  if (!had_support) s.sampling_support.clear();
}

}  // namespace slimpi
