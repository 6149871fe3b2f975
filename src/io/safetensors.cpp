#include "io/safetensors.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace slimpi {
namespace {

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {{at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"},
                                 {at::kBFloat16, "BF16"}, {at::kLong, "I64"}, {at::kInt, "I32"},
                                 {at::kByte, "U8"}};

const char* dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  SLIMPI_FAIL("safetensors: no dtype name for {}", std::string(c10::toString(t)));
}

at::ScalarType dtype_of(const std::string& name, const std::string& path) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.type;
  SLIMPI_FAIL("{}: unsupported safetensors dtype '{}'", path, name);
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> cpu;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    at::Tensor c = t.tensor.detach().to(at::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(c.numel()) * c.element_size();
    header[t.name] = {{"dtype", dtype_name(c.scalar_type())},
                      {"shape", c.sizes().vec()},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    cpu.push_back(c);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  std::ofstream out(path, std::ios::binary);
  SLIMPI_CHECK(out, "cannot write {}", path);
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(n));
  for (const auto& c : cpu)
    out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.numel() * c.element_size()));
  out.close();
  SLIMPI_CHECK(out, "write to {} failed", path);
}

std::vector<NamedTensor> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SLIMPI_CHECK(in, "cannot read {}", path);
  const uint64_t file_size = std::filesystem::file_size(path);
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  SLIMPI_CHECK(in && n <= file_size - 8, "{}: not a safetensors file (header length {})", path, n);
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    SLIMPI_FAIL("{}: malformed safetensors header: {}", path, e.what());
  }
  const uint64_t data_start = 8 + n;
  std::vector<NamedTensor> out;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    at::Tensor t = at::empty(info.at("shape").get<std::vector<int64_t>>(),
                             dtype_of(info.at("dtype").get<std::string>(), path));
    const auto offsets = info.at("data_offsets").get<std::vector<uint64_t>>();
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    SLIMPI_CHECK(offsets.size() == 2 && offsets[1] - offsets[0] == bytes && data_start + offsets[1] <= file_size,
                 "{}: tensor {} has data_offsets inconsistent with its shape or the file size", path, name);
    in.seekg(static_cast<std::streamoff>(data_start + offsets[0]));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(bytes));
    SLIMPI_CHECK(in, "{}: short read of tensor {}", path, name);
    out.push_back({name, t});
  }
  return out;
}

}  // namespace slimpi
