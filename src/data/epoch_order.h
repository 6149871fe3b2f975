// EpochOrder — the order in which a data set of n records is visited, epoch after
// epoch: epoch e is a permutation drawn from (seed, e). order(k) is the record of the
// k-th draw overall, a pure function of (seed, k), so a cursor is just a count.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace slimpi {

class EpochOrder {
 public:
  EpochOrder(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  int64_t order(int64_t k) const;
  int64_t size() const { return n_; }

 private:
  int64_t n_;
  uint64_t seed_;
  mutable std::map<int64_t, std::vector<int64_t>> epochs_;  // epoch -> permutation (cache)
};

}  // namespace slimpi
