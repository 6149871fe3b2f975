#include "train/gradient_groups.h"

#include "model/tensor_shard.h"
#include "model/transformer.h"

namespace slimpi {

GradientGroup group_of(const Transformer& model, const std::string& name) {
  if (model.expert_shard().size > 1 && Transformer::is_expert_parameter(name)) return GradientGroup::Experts;
  const int t = model.tensor_shard().size;
  if (t == 1) return GradientGroup::Replicated;
  const ParameterSplit split = parameter_split(name, model.config(), t);
  if (!split.split()) return GradientGroup::Replicated;
  return split.replicas > 1 ? GradientGroup::KvReplicas : GradientGroup::TensorSplit;
}

}  // namespace slimpi
