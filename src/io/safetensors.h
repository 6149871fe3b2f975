// safetensors files (Hugging Face's tensor format): an 8-byte little-endian header
// length N, N bytes of JSON {"<name>": {"dtype": "F32", "shape": [..],
// "data_offsets": [begin, end]}, ..., "__metadata__": {..}} padded with spaces to a
// multiple of 8, then the tensors' bytes back to back (offsets relative to that start).
// Row-major, little-endian. Dtypes: F64 F32 F16 BF16 I64 I32 U8 F8_E4M3.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/named_tensor.h"

namespace slimpi {

// Writes `tensors` (any device; copied to the CPU) in the given order.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// Reads every tensor of `path` (CPU tensors), sorted by name. Throws slimpi::Error
// naming the file and the problem on a malformed file.
std::vector<NamedTensor> read_safetensors(const std::string& path);

// SafetensorsReader — the tensors of one checkpoint as Hugging Face stores it: a
// .safetensors file, a directory with model.safetensors, or a sharded directory whose
// model.safetensors.index.json maps each tensor to its shard (the index file's path
// works too). Every header is parsed and checked at open (offsets against shapes and
// file sizes, each indexed tensor present in its shard); a tensor's bytes are read,
// when asked for, from a read-only memory map of its shard, so a reader touches only
// the pages of the tensors it takes. Owned by the caller; not thread-safe.
class SafetensorsReader {
 public:
  struct Entry {
    std::string file;
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // absolute byte offsets in file
  };
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  const std::map<std::string, Entry>& entries() const { return entries_; }
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  // A CPU copy of the tensor, in its stored dtype.
  at::Tensor read(const std::string& name) const;
  // "DIR (3 shards)" or the file: what error messages name.
  const std::string& description() const { return description_; }

 private:
  struct Mapping;
  std::map<std::string, Entry> entries_;
  std::string description_;
  mutable std::map<std::string, std::unique_ptr<Mapping>> maps_;
};

}  // namespace slimpi
