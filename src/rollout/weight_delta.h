// Weight deltas — rollout.weight_sync = "delta": a bucket of the weights being sent,
// compared element by element and bitwise (in the rollout precision, as integer words:
// -0.0 and 0.0 differ, a NaN equals itself) with the copy the engines already hold,
// sent as whichever is smaller of
//   raw     the bucket's bytes, or
//   sparse  K int32 element indices within the bucket, then their K new words.
// Pure functions on byte tensors (uint8, one device); the protocol around them (who
// holds which version, anchors, checksums) is WeightSync's (rollout/weight_sync.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace slimpi {

enum class DeltaKind : int64_t { Raw = 0, Sparse = 1 };

struct BucketDelta {
  DeltaKind kind = DeltaKind::Raw;
  int64_t changed = 0;  // elements that differ
  at::Tensor payload;   // uint8: the bucket's bytes (raw), or indices then values (sparse)
};

// now, before: uint8 [B], B a multiple of element_size (1, 2 or 4 bytes), B / element_size
// below 2^31 (int32 indices).
BucketDelta encode_bucket(const at::Tensor& now, const at::Tensor& before, int64_t element_size);
// Applies a payload of `kind` holding `changed` elements to `bucket` (uint8 [B], in place).
void apply_bucket(const at::Tensor& bucket, DeltaKind kind, int64_t changed, const at::Tensor& payload,
                  int64_t element_size);
// XXH3-64 of a byte tensor's contents (copied to the host when it lives on a device).
uint64_t xxh3_of(const at::Tensor& bytes);

}  // namespace slimpi
