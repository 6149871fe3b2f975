// Weight sync — trainer rank 0 (sync rank 0) broadcasts the policy's weights to every
// engine over the `sync` communicator (docs/architecture.md, the step table).
//
// Header first (version, then every tensor's name, dtype and shape, as bytes); each
// receiver checks it against its own model, so a mismatch is an error naming the
// tensor. Then the bytes travel in fixed-size buckets. When the model keeps its
// parameters in one flat buffer (Transformer::flat_parameters()) in the memory the
// backend uses, the buckets are slices of that buffer, broadcast in place: no copy on
// either side. Otherwise the tensors are packed back to back through one byte buffer
// allocated once per WeightSync (a tensor larger than a bucket spans several) and
// receivers copy them into their parameters. Collective over `sync`.
//
// Delta sync (rollout.weight_sync = "delta", DeltaSyncConfig): every rank remembers the
// version its copy holds (the root keeps a copy of the bytes it last sent; an engine's
// copy is its own parameters). When all hold the same version, each bucket travels as
// its delta against it (sync/weight_delta.h: raw or sparse, the smaller); then every
// engine hashes its result (XXH3) against the root's hash, and on any difference the
// whole model is sent again. An anchor (everything, as a full sync) goes when the copies
// disagree or are missing (the first sync, a resumed job), and every
// `anchor_interval` syncs. Needs the flat buffer on every rank; without one every sync
// is whole. Fault injection for tests: SLIMPI_FAULT_DELTA_CORRUPT_AT=V flips a byte of
// sync rank 1's weights after the delta of version V, before the check.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <functional>
#include <vector>

#include "model/transformer.h"
#include "parallel/comm.h"
#include "sync/weight_delta.h"

namespace slimpi {

// FNV-1a over bytes, continuing from h (start at kFnvOffset): the weight syncs' checksums.
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
uint64_t fnv1a(uint64_t h, const uint8_t* data, int64_t n);

struct WeightSyncStats {
  int64_t bytes = 0;
  int64_t n_buckets = 0;
  double seconds = 0;
  uint64_t checksum = 0;  // FNV-1a of every byte sent (a delta: XXH3 of the result), computed on every rank
  // Delta sync (root): elements changed over elements (1 for a whole sync), whether the
  // sync was whole (an anchor), and whether a delta failed its check and went again whole.
  double density = 1;
  bool anchor = true, resent = false;
};


// The model's weights as `dtype` for sending: its own flat buffer and tensors when they
// already are (no copy), else one converted copy made now (flat + views in the same
// order): the fp32 masters rounded to bf16 once per sync for a bf16 rollout.
struct WeightImage {
  at::Tensor flat;
  std::vector<NamedTensor> params;
};
WeightImage weight_image(const Transformer& model, at::ScalarType dtype);

class WeightSync {
 public:
  WeightSync(Comm& sync, int64_t bucket_bytes, DeltaSyncConfig delta = {});

  // Root (sync rank 0): sends `params` and `version`. Others: receive into `params`
  // (their own model's, same names/shapes/dtypes) and return the root's version in
  // *version. With `checksum`, every rank hashes the bytes it sent/received.
  // `flat` (optional): the buffer every tensor of `params` is a view of, in order.
  WeightSyncStats sync(const std::vector<NamedTensor>& params, int64_t* version, bool checksum,
                       const at::Tensor& flat = at::Tensor());

 private:
  // Every member agrees on the version and the tensor list before any bucket moves.
  void agree_on_tensors(const std::vector<NamedTensor>& params, int64_t* version);
  // The tensors as one byte stream in buckets (when they are not one flat buffer).
  void broadcast_packed(const std::vector<NamedTensor>& params, const std::function<void(const at::Tensor&)>& account);
  // Delta sync over `bytes` (the flat buffer as uint8); false when an engine's check failed.
  bool send_delta(const at::Tensor& bytes, int64_t version, int64_t element_size, WeightSyncStats& stats);
  Comm& comm_;
  at::Tensor bucket_;  // [bucket_bytes] uint8, host or device as the backend wants
  DeltaVersions versions_;
  at::Tensor last_;             // root: the bytes it last sent (uint8)
};

}  // namespace slimpi
