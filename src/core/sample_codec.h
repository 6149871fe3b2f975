// The one wire format of slimpi::Sample between ranks of the same binary (router ↔
// engines, router → trainers): every field, in declaration order, as ByteWriter PODs
// and vectors. A message that does not decode to exactly its bytes is an error.
#pragma once

#include <slimpi/sample.h>

#include <string>
#include <vector>

namespace slimpi {

std::string encode_samples(const std::vector<Sample>& samples);
std::vector<Sample> decode_samples(const std::string& bytes);

}  // namespace slimpi
