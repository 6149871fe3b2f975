// safetensors files (Hugging Face's tensor format): an 8-byte little-endian header
// length N, N bytes of JSON {"<name>": {"dtype": "F32", "shape": [..],
// "data_offsets": [begin, end]}, ..., "__metadata__": {..}} padded with spaces to a
// multiple of 8, then the tensors' bytes back to back (offsets relative to that start).
// Row-major, little-endian. Dtypes: F64 F32 F16 BF16 I64 I32 U8.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "io/named_tensor.h"

namespace slimpi {

// Writes `tensors` (any device; copied to the CPU) in the given order.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// Reads every tensor of `path` (CPU tensors), sorted by name. Throws slimpi::Error
// naming the file and the problem on a malformed file.
std::vector<NamedTensor> read_safetensors(const std::string& path);

}  // namespace slimpi
