// Tensors in HDF5 files: one dataset per tensor, named by the tensor's name (a name
// with '/' nests groups), shape kept, dtype kept (attribute "dtype": float32, float64,
// bfloat16, float16, int64, int32, uint8; bf16/fp16 are stored as their raw 16-bit
// patterns). Used by checkpoints and model export. write_tensor: serial files (one rank
// writes whole tensors); io/tensor_pieces.h writes and reads the parts ranks hold.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "io/h5.h"
#include "core/named_tensor.h"
#include "model/pipeline_shard.h"
#include "model/tensor_shard.h"

namespace slimpi {

// How tensors of a dtype are stored: the "dtype" attribute's value and the HDF5 type.
struct StoredDtype {
  const char* name;
  at::ScalarType torch;
  hid_t h5;
};
const std::vector<StoredDtype>& stored_dtypes();
const StoredDtype& stored_dtype(at::ScalarType dtype);  // throws for a dtype files cannot hold

// A contiguous dataset for a tensor of `shape` and `dtype` (intermediate groups made, the
// dtype attribute written). Collective in a parallel file. filled = false: its space is
// never pre-filled (the caller writes every element).
h5::Handle create_tensor_dataset(hid_t loc, const std::string& name, const std::vector<int64_t>& shape,
                                 at::ScalarType dtype, bool filled);
// An open tensor dataset's stored dtype and shape (`name` for the error).
struct StoredTensorInfo {
  const StoredDtype* dtype = nullptr;
  std::vector<int64_t> shape;
};
StoredTensorInfo stored_tensor_info(hid_t dataset, const std::string& name);

void write_tensor(hid_t loc, const std::string& name, const at::Tensor& tensor);
at::Tensor read_tensor(hid_t loc, const std::string& name);

void write_tensors(hid_t loc, const std::vector<NamedTensor>& tensors);
// Reads the stored tensors of the targets' names into the targets themselves (contiguous
// tensors, CPU or GPU), every shape and dtype checked before any is read; one tensor's
// buffer at most besides the targets (a GPU target's, or one whose dtype differs).
// any_float: a stored floating-point dtype may differ from the target's (converted).
// stored: a tensor-parallel shard's tensors are stored whole; each is checked against
// the whole shape and only the shard's part is read (model/tensor_shard.h).
void read_tensors_into(hid_t loc, const std::vector<NamedTensor>& targets, bool any_float = false,
                       const StoredWhole& stored = {});

// Copies the tensors of group `group` of HDF5 file `path` into `params` (a model's
// parameters; names and shapes must match; floating dtypes are converted, e.g. an fp32
// checkpoint into a bf16 engine model; the error names the first that does not). A
// Hugging Face checkpoint — a directory (model.safetensors or a sharded
// model.safetensors.index.json), a .safetensors file or an index .json — is read
// through a memory map instead, fp32/bf16/fp16 converted, tensors matched by name: every
// tensor missing, unused or mis-shaped is an error listing them. experts_sharded: `params`
// hold one expert-parallel shard, so the other shards' "mlp.experts.<e>." tensors are
// not unused. stored: as for read_tensors_into (tensor parallelism); its cfg is required for
// a hybrid model (its channel order, above). One tensor at a time:
// besides the parameters, at most one tensor (whole, for a Hugging Face file) is held.
// A hybrid model's Gated DeltaNet q/k/v channels are held grouped by key head
// (model/linear_channels.h): a Hugging Face checkpoint's are converted as they load, and
// slimpi's own model groups carry an attribute that says their order (written by
// mark_linear_channel_order; one without it, from an older slimpi, is refused by
// check_linear_channel_order, naming `path`). Both do nothing for other models.
void mark_linear_channel_order(hid_t group, const ModelConfig& cfg);
void check_linear_channel_order(hid_t group, const std::vector<NamedTensor>& params, const StoredWhole& stored,
                                const std::string& path);

// stage: a pipeline stage's parameters (model/pipeline_shard.h): the files' tensors of the
// other stages are not unused (stored.cfg required then).
void load_model_weights(const std::vector<NamedTensor>& params, const std::string& path,
                        const std::string& group = "model", bool experts_sharded = false,
                        const StoredWhole& stored = {}, const PipelineShard& stage = {});

}  // namespace slimpi
