// The whole model from its shards: the tensors a tensor-parallel and/or expert-parallel
// trainer rank holds (parameters, or optimizer moments named "exp_avg/<parameter>"),
// gathered into the whole model's tensors under its names and shapes — what the
// broadcast weight sync pushes, what a colocated engine runs, what HF export writes
// (checkpoints are written by each rank in place: io/tensor_pieces.h).
// Experts are gathered over the expert group (train/expert_parallel.h), then the
// tensor-parallel splits over the tensor group (model/tensor_shard.h: padding dropped),
// then the pipeline stages' layers over the pipeline group (model/pipeline_shard.h).
#pragma once

#include <cstdint>
#include <vector>

#include "core/named_tensor.h"

namespace slimpi {

class Transformer;

// `local`: tensors of `shard_model`'s shard. Collective over its tensor, expert and
// pipeline groups. to_all: every rank gets the whole tensors. Otherwise they end on the first
// rank of the groups (trainer rank 0 when the ranks of ModelParallel::
// joins_gather_to_first() call); every other rank gets an empty list.
std::vector<NamedTensor> whole_tensors(const Transformer& shard_model, const std::vector<NamedTensor>& local,
                                       bool to_all);

// Sets `target` (the same config and tensor shard as `shard`, every expert, any weight
// dtype: a colocated tensor-parallel engine's model) to the weights of `shard`, the
// experts gathered over its expert group. Collective over that group (none without
// expert parallelism: a copy).
void copy_tensor_shard(const Transformer& shard, Transformer& target);

// Sets `whole` (the same config unsharded; any weight dtype) to the weights of the
// sharded model `shard` and the other shards of its groups. Collective as above.
// `whole` null: this rank only contributes (to_all = false); otherwise the ranks that
// receive pass one.
void gather_whole_model(const Transformer& shard, Transformer* whole, bool to_all = true);

}  // namespace slimpi
