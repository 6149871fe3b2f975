// NamedTensor — a tensor with its Hugging Face-style name: the unit of every weight
// file slimpi reads and writes (HDF5 groups, safetensors) and of a model's parameter
// list. The tensor is a handle: copying a NamedTensor shares its storage.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace slimpi {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

}  // namespace slimpi
