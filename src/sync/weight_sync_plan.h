// Sliced weight sync — from the trainer's layout (tensor parallel t x expert parallel G
// x data parallel) to the engines' (tensor parallel e), each engine rank receives only
// its shard of every tensor, point to point from the trainer ranks that hold it
// (rollout.weight_sync_route = "sliced"; docs/parallelism.md, weight sync).
//
// The members (the sliced_sync communicator, parallel/world.h), in rank order:
//   [0, t·G)               trainer ranks of the first G data-parallel indices: sync rank
//                          r is tensor rank r % t of data-parallel index r / t (together
//                          they hold every dense shard and every expert once)
//   t·G + i·e + j          rank j of engine i
// The plan is made once, on every member alike, from the two layouts and the whole
// model's tensor list (names and whole shapes, sent by the first engine rank): for
// every tensor and engine rank, the rows (or columns) of the tensor it holds, cut where
// the trainer's shards meet, each piece from one trainer rank (a tensor replicated over
// the trainer's tensor group is taken from rank k = (tensor + engine rank) mod t, which
// spreads them; expert x from the data-parallel index that holds it). Padded vocabulary
// rows are never sent (both sides keep theirs zero).
// Transfers: the pieces of one (sender, receiver) pair travel back to back in buckets of
// at most bucket_bytes, converted to the engines' dtype on the sender. Pairs run in one
// global order, (receiver, sender), on every rank: blocking sends cannot deadlock.
// With `checksum`, each sender sends the FNV-1a of the bytes it sent to a receiver, and
// the receiver refuses a pair whose bytes hash differently, naming its tensors.
// Delta sync (rollout.weight_sync = "delta"): as WeightSync's (sync/weight_sync.h),
// pair by pair: a sender keeps the wire bytes it last sent on each of its pairs, a
// receiver rebuilds its side from its own tensors; each pair's bytes go as their delta
// (sync/weight_delta.h) in chunks of at most bucket_bytes, the receiver checks the
// result's XXH3 against the sender's before taking it, and any pair's mismatch sends
// the whole plan again. Anchors as WeightSync's.
// Owned by the driver on sliced_sync members; collective over that communicator.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/named_tensor.h"
#include "model/model_config.h"
#include "sync/weight_delta.h"
#include "sync/weight_sync.h"

namespace slimpi {

class Comm;

struct SyncLayout {
  int trainer_tensor = 1, trainer_expert = 1;  // t, G
  int n_engines = 1, engine_tensor = 1;        // engines, e
  int n_trainer_members() const { return trainer_tensor * trainer_expert; }
  int n_members() const { return n_trainer_members() + n_engines * engine_tensor; }
  int engine_member(int engine, int rank) const { return n_trainer_members() + engine * engine_tensor + rank; }
};

// A whole-model tensor as the plan sees it.
struct WholeTensor {
  std::string name;
  std::vector<int64_t> shape;
};

// One slice of one tensor from a trainer member to an engine member: [begin, end) along
// `dim` of the whole tensor; at local index begin - src_origin in the sender's tensor
// and begin - dst_origin in the receiver's.
struct WeightPiece {
  int tensor = 0;  // index into the plan's tensor list
  int src = 0, dst = 0;
  int dim = 0;
  int64_t begin = 0, end = 0;
  int64_t src_origin = 0, dst_origin = 0;
  int64_t numel = 0;  // elements of the piece
};

class WeightSyncPlan {
 public:
  WeightSyncPlan() = default;
  // Every piece, ordered by (receiver, sender, tensor).
  WeightSyncPlan(const ModelConfig& cfg, const SyncLayout& layout, std::vector<WholeTensor> tensors);
  const std::vector<WholeTensor>& tensors() const { return tensors_; }
  const std::vector<WeightPiece>& pieces() const { return pieces_; }
  const SyncLayout& layout() const { return layout_; }
  // Elements sent in all (each engine rank's share of the model, summed).
  int64_t total_elements() const;

 private:
  SyncLayout layout_;
  std::vector<WholeTensor> tensors_;
  std::vector<WeightPiece> pieces_;
};

class SlicedWeightSync {
 public:
  SlicedWeightSync(Comm& sync, const ModelConfig& cfg, const SyncLayout& layout, int64_t bucket_bytes,
                   DeltaSyncConfig delta = {});

  // Every member: `local`, this rank's tensors under the whole model's names (a trainer
  // shard's parameters; an engine shard's, received into in place); `wire` the engines'
  // dtype. Sync rank 0 (trainer rank 0) gives `version`; every rank returns it in
  // *version. The first call makes the plan (the first engine rank sends the tensor
  // list). Stats: bytes = every transfer's, summed over the plan; checksum unused.
  WeightSyncStats sync(const std::vector<NamedTensor>& local, at::ScalarType wire, int64_t* version, bool checksum);
  const WeightSyncPlan& plan() const { return plan_; }

 private:
  using LocalTensors = std::map<std::string, const at::Tensor*>;  // this rank's tensors by name
  // Piece p's bytes [from, from + n) at offset `at` of a bucket.
  struct Span {
    size_t piece;
    int64_t from, n, at;
  };
  // The first engine rank's tensors as whole names and shapes, on every member.
  std::vector<WholeTensor> agree_on_tensors(const std::vector<NamedTensor>& local);
  // The pieces [first, last) of one pair, cut into buckets of at most bucket_bytes_.
  std::vector<std::vector<Span>> buckets_of(size_t first, size_t last, int64_t element_bytes) const;
  at::Tensor local_part(const LocalTensors& local, const WeightPiece& p, bool sender) const;
  // One pair's transfer, this rank's side; returns the FNV-1a of its bytes (with checksums).
  uint64_t send_pair(const LocalTensors& local, size_t first, size_t last, at::ScalarType wire,
                     WeightSyncStats& stats);
  uint64_t receive_pair(const LocalTensors& local, size_t first, size_t last, at::ScalarType wire,
                        WeightSyncStats& stats);
  uint64_t hash_bucket(uint64_t hash, const at::Tensor& bucket) const;
  // A pair's pieces [first, last) as one byte stream in `wire`: the sender's, converted from
  // its shard, or the receiver's, read from the tensors it holds; and back into them.
  at::Tensor pair_stream(const LocalTensors& local, size_t first, size_t last, at::ScalarType wire, bool sender) const;
  void unpack_stream(const LocalTensors& local, size_t first, size_t last, at::ScalarType wire,
                     const at::Tensor& bytes) const;
  // The end of the pair that starts at piece `first` (the plan's pieces of one
  // (receiver, sender) pair are consecutive).
  size_t pair_end(size_t first) const;
  // Delta sync: one delta pass over every pair (false: a receiver's check failed); the
  // senders' copies after a whole sync.
  bool send_deltas(const LocalTensors& local, at::ScalarType wire, int64_t version, WeightSyncStats& stats);
  void remember_sent(const LocalTensors& local, at::ScalarType wire);
  Comm& comm_;
  ModelConfig cfg_;
  SyncLayout layout_;
  int64_t bucket_bytes_;
  bool planned_ = false;
  bool checksum_ = false;  // this sync's
  WeightSyncPlan plan_;
  at::Tensor bucket_;  // [bucket_bytes] uint8 on the backend's side
  DeltaVersions versions_;
  std::map<size_t, at::Tensor> sent_;             // sender: a pair's first piece -> its wire bytes last sent
};

}  // namespace slimpi
