// The whole model from its shards: the tensors a tensor-parallel and/or expert-parallel
// trainer rank holds (parameters, or optimizer moments named "exp_avg/<parameter>"),
// gathered into the whole model's tensors under its names and shapes — what
// checkpoints store, what the weight sync pushes, what a colocated engine runs.
// Experts are gathered over the expert group (train/expert_parallel.h), then the
// tensor-parallel splits over the tensor group (model/tensor_shard.h: padding dropped).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/named_tensor.h"

namespace slimpi {

class Transformer;

// `local`: tensors of `shard_model`'s shard. Collective over its tensor and expert
// groups. to_all: every rank gets the whole tensors. Otherwise they end on the first
// rank of the groups (trainer rank 0 when the ranks of ModelParallel::
// joins_gather_to_first() call); every other rank gets an empty list.
std::vector<NamedTensor> whole_tensors(const Transformer& shard_model, const std::vector<NamedTensor>& local,
                                       bool to_all);

// The same tensors streamed: `consume` gets the whole tensors of `local` a chunk at a
// time on the rank whole_tensors(to_all = false) would give them to (nothing elsewhere),
// so that no rank holds more than one chunk of whole tensors beyond its own shards. The
// dense tensors (everything but routed experts' "mlp.experts.<e>." ones) are joined over
// the tensor group in chunks of at most chunk_bytes (of this rank's part), by the ranks
// with joins_dense only (the tensor group of the first data-parallel index; the chunks
// are the same on every rank of a tensor group, whose shards have equal shapes); the
// experts then go through whole_tensors in one piece (collective over the expert groups).
void stream_whole_tensors(const Transformer& shard_model, const std::vector<NamedTensor>& local, bool joins_dense,
                          int64_t chunk_bytes, const std::function<void(const std::vector<NamedTensor>&)>& consume);

// Sets `whole` (the same config unsharded; any weight dtype) to the weights of the
// sharded model `shard` and the other shards of its groups. Collective as above.
// `whole` null: this rank only contributes (to_all = false); otherwise the ranks that
// receive pass one.
void gather_whole_model(const Transformer& shard, Transformer* whole, bool to_all = true);

}  // namespace slimpi
