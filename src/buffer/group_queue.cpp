#include "buffer/group_queue.h"

#include <algorithm>
#include <limits>

#include "buffer/rollout_batch.h"

namespace slimpi {
namespace {

int64_t oldest_version(const std::vector<Sample>& samples) {
  int64_t oldest = std::numeric_limits<int64_t>::max();
  for (const auto& s : samples)
    for (int64_t v : s.weight_versions) oldest = std::min(oldest, v);
  return oldest;
}

}  // namespace

bool GroupQueue::is_stale(const std::vector<Sample>& samples, int64_t step) const {
  return max_staleness_ >= 0 && step - oldest_version(samples) > max_staleness_;
}

void GroupQueue::retire(Group group) {
  for (auto& s : group.samples) {
    slimpi::retire(s, SampleStatus::Stale);
    unused_.push_back(std::move(s));
  }
  if (regenerate_stale_) {
    redraw_.push_back(std::move(group.prompt));
    counts_["rollout/async/stale_regenerated_groups"] += 1;
  } else {
    counts_["rollout/async/stale_dropped_groups"] += 1;
  }
}

void GroupQueue::add(Group group, bool kept, int64_t step) {
  if (!kept) {
    for (auto& s : group.samples) {
      slimpi::retire(s, SampleStatus::Filtered);  // (a failed episode stays EnvFailed)
      unused_.push_back(std::move(s));
    }
  } else if (is_stale(group.samples, step)) {
    retire(std::move(group));
  } else {
    ready_.push_back(std::move(group));
  }
}

void GroupQueue::retire_stale(int64_t step) {
  std::deque<Group> fresh;
  for (auto& g : ready_) {
    if (is_stale(g.samples, step)) retire(std::move(g));
    else fresh.push_back(std::move(g));
  }
  ready_ = std::move(fresh);
}

int64_t GroupQueue::take(int64_t n, int64_t step, bool mask_offpolicy, RolloutBatch& batch) {
  int64_t partial_samples = 0;
  for (int64_t k = 0; k < n && !ready_.empty(); ++k) {
    for (auto& s : ready_.front().samples) {
      s.step = step;
      const auto [lo, hi] = std::minmax_element(s.weight_versions.begin(), s.weight_versions.end());
      if (!s.weight_versions.empty() && *lo != *hi) {
        ++partial_samples;
        if (mask_offpolicy) {  // on top of the sample's own mask (an episode's environment tokens stay 0)
          if (s.loss_mask.empty()) s.loss_mask.assign(s.weight_versions.size(), 1.0f);
          for (size_t i = 0; i < s.weight_versions.size(); ++i)
            if (s.weight_versions[i] != *hi) s.loss_mask[i] = 0.0f;
        }
      }
      batch.kept.push_back(std::move(s));
    }
    ready_.pop_front();
  }
  for (auto& s : unused_) s.step = step;
  batch.unused = std::move(unused_);
  unused_.clear();
  return partial_samples;
}

std::optional<Prompt> GroupQueue::next_redraw() {
  if (redraw_.empty()) return std::nullopt;
  Prompt p = std::move(redraw_.front());
  redraw_.pop_front();
  return p;
}

void GroupQueue::restore(std::deque<Group> groups, std::vector<Sample> unused, std::deque<Prompt> redraws) {
  ready_ = std::move(groups);
  unused_ = std::move(unused);
  redraw_ = std::move(redraws);
}

}  // namespace slimpi
