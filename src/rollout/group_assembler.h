// GroupAssembler — collects an engine's finished samples until their group is whole, so
// that routers move whole groups (rollout/router.h, rollout/disaggregated_router.h).
// Owned by one router call; plain data.
#pragma once

#include <slimpi/sample.h>

#include <cstdint>
#include <map>
#include <vector>

#include "rollout/request.h"

namespace slimpi {

class GroupAssembler {
 public:
  explicit GroupAssembler(const std::vector<GenerationRequest>& requests) {
    for (const auto& r : requests) size_[r.group_index] = r.n_samples;
  }
  // The groups completed by `samples`, whole.
  std::vector<std::vector<Sample>> add(std::vector<Sample> samples) {
    std::vector<std::vector<Sample>> complete;
    for (auto& s : samples) {
      const int64_t group = s.group_index;
      auto& g = partial_[group];
      g.push_back(std::move(s));
      if (int64_t(g.size()) == size_.at(group)) {
        complete.push_back(std::move(g));
        partial_.erase(group);
      }
    }
    return complete;
  }

 private:
  std::map<int64_t, int64_t> size_;
  std::map<int64_t, std::vector<Sample>> partial_;
};

}  // namespace slimpi
