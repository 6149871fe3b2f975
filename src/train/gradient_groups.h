// The kinds of a model's parameters, each with its own gradient buffer (the Trainer's and
// the Critic's): replicated on every rank of the tensor group (all of them without model
// parallelism), split over the tensor group (model/tensor_shard.h), split with each part
// on several ranks of the group (key/value heads replicated when t > Hkv), one expert
// shard's (expert parallelism). Parameters the model does not know by name (a critic's
// value head) are replicated.
#pragma once

#include <string>

namespace slimpi {

class Transformer;

enum class GradientGroup { Replicated, TensorSplit, KvReplicas, Experts };

GradientGroup group_of(const Transformer& model, const std::string& name);

}  // namespace slimpi
