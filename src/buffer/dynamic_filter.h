// Dynamic filters (slime's --dynamic-sampling-filter-path): decide per prompt group,
// from its samples' raw rewards, whether the group is trained on. A registry keyed by
// the deck's rollout.dynamic_filter string:
//   none         keep every group (one sampling round per step)
//   nonzero_std  keep a group whose reward std (unbiased, N−1) exceeds 1e-6
//                (slime's check_reward_nonzero_std); a group of one is never kept
// Dropped groups are logged in rollouts.h5 with status 5 and counted as
// rollout/dynamic_filter/drop_zero_std.
#pragma once

#include <functional>
#include <vector>

#include "core/registry.h"

namespace slimpi {

struct DynamicFilter {
  std::function<bool(const std::vector<float>& group_raw_rewards)> keep;
  // True for `none`: no group is ever dropped, so one sampling round always suffices.
  bool identity = false;
  bool is_identity() const { return identity; }
};

const Registry<DynamicFilter>& dynamic_filters();

}  // namespace slimpi
