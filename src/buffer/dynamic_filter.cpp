#include "buffer/dynamic_filter.h"

#include <cmath>

namespace slimpi {
namespace {

bool nonzero_std(const std::vector<float>& r) {
  const double n = double(r.size());
  if (r.size() < 2) return false;
  double mean = 0, var = 0;
  for (float x : r) mean += x / n;
  for (float x : r) var += (x - mean) * (x - mean);
  return std::sqrt(var / (n - 1)) > 1e-6;
}

}  // namespace

const Registry<DynamicFilter>& dynamic_filters() {
  static const Registry<DynamicFilter> r = [] {
    Registry<DynamicFilter> reg("rollout.dynamic_filter");
    reg.add("none", {[](const std::vector<float>&) { return true; }, true});
    reg.add("nonzero_std", {nonzero_std, false});
    return reg;
  }();
  return r;
}

}  // namespace slimpi
