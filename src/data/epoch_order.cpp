#include "data/epoch_order.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace slimpi {

int64_t EpochOrder::order(int64_t k) const {
  const int64_t epoch = k / n_;
  auto it = epochs_.find(epoch);
  if (it == epochs_.end()) {
    if (epochs_.size() > 4) epochs_.erase(epochs_.begin());  // keep the cache small
    at::Generator gen = at::detail::createCPUGenerator(seed_ * 1000003ULL + static_cast<uint64_t>(epoch));
    at::Tensor perm = at::randperm(n_, gen, at::kLong);
    it = epochs_.emplace(epoch, std::vector<int64_t>(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + n_)).first;
  }
  return it->second[k % n_];
}

}  // namespace slimpi
