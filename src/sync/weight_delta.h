// Weight deltas — rollout.weight_sync = "delta": a bucket of the weights being sent,
// compared element by element and bitwise (in the rollout precision, as integer words:
// -0.0 and 0.0 differ, a NaN equals itself) with the copy the engines already hold,
// sent as whichever is smaller of
//   raw       the bucket's bytes,
//   sparse    K int32 element indices within the bucket, then their K new words, or
//   xor_zstd  the bucket XOR the held copy, compressed by zstd (level 1): unchanged
//             elements are zero bytes, and changed ones share their high bytes (sign,
//             exponent) with the old value, which zstd also squeezes.
// (Measured on the quickstart in perf/results: docs/parallelism.md, delta sync.)
// The codec is pure functions on byte tensors (uint8, one device). DeltaVersions keeps
// the one piece of protocol both routes share (which version each member's copy holds,
// when an anchor is due); the transfers and checks around them are WeightSync's
// (broadcast, sync/weight_sync.h) and SlicedWeightSync's (sync/weight_sync_plan.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace slimpi {

class Comm;

struct DeltaSyncConfig {
  bool enabled = false;          // rollout.weight_sync = "delta"
  int64_t anchor_interval = 10;  // rollout.delta_anchor_interval: a whole sync every this many
};

// One member's side of delta sync: the version its copy holds (-1: none) and the deltas
// since the last whole sync (an anchor).
class DeltaVersions {
 public:
  explicit DeltaVersions(DeltaSyncConfig cfg);
  bool enabled() const { return cfg_.enabled; }
  // Collective over `comm`: every member holds the same version and has its copy at hand
  // (`have_copy`), and member 0 has no anchor due.
  bool delta_possible(Comm& comm, bool have_copy) const;
  void delta_sent(int64_t version) {
    base_ = version;
    ++since_anchor_;
  }
  // A whole sync of `version`; `holds`: this member keeps a copy of it.
  void whole_sent(int64_t version, bool holds) {
    base_ = holds ? version : -1;
    since_anchor_ = 0;
  }

 private:
  DeltaSyncConfig cfg_;
  int64_t base_ = -1, since_anchor_ = 0;
};

// Fault injection for the tests: SLIMPI_FAULT_DELTA_CORRUPT_AT names `version`.
bool delta_corruption_due(int64_t version);

enum class DeltaKind : int64_t { Raw = 0, Sparse = 1, XorZstd = 2 };

struct BucketDelta {
  DeltaKind kind = DeltaKind::Raw;
  int64_t changed = 0;  // elements that differ
  at::Tensor payload;   // uint8: the bucket's bytes (raw), indices then values (sparse), or zstd frame (xor_zstd)
};

// now, before: uint8 [B], B a multiple of element_size (1, 2 or 4 bytes), B / element_size
// below 2^31 (int32 indices).
BucketDelta encode_bucket(const at::Tensor& now, const at::Tensor& before, int64_t element_size);
// Applies a payload of `kind` holding `changed` elements to `bucket` (uint8 [B], in place;
// the copy the sender diffed against).
void apply_bucket(const at::Tensor& bucket, DeltaKind kind, int64_t changed, const at::Tensor& payload,
                  int64_t element_size);
// XXH3-64 of a byte tensor's contents (copied to the host when it lives on a device).
uint64_t xxh3_of(const at::Tensor& bytes);

}  // namespace slimpi
