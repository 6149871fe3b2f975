#include "io/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <slimpi/error.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/file_write.h"

namespace slimpi {
namespace {

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {{at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"},
                                 {at::kBFloat16, "BF16"}, {at::kLong, "I64"}, {at::kInt, "I32"},
                                 {at::kByte, "U8"}, {at::kFloat8_e4m3fn, "F8_E4M3"}};

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

// The header of one file: its tensors with absolute offsets, checked against the file.
std::map<std::string, SafetensorsReader::Entry> read_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SLIMPI_CHECK(in, "cannot read {}", path);
  const uint64_t file_size = std::filesystem::file_size(path);
  unsigned char len[8] = {};
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  SLIMPI_CHECK(in && file_size >= 8 && n <= file_size - 8, "{}: not a safetensors file (header length {})", path, n);
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    SLIMPI_FAIL("{}: malformed safetensors header: {}", path, e.what());
  }
  const uint64_t data_start = 8 + n;
  std::map<std::string, SafetensorsReader::Entry> out;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    SafetensorsReader::Entry e;
    e.file = path;
    try {
      e.dtype = dtype_of(info.at("dtype").get<std::string>(), path);
      e.shape = info.at("shape").get<std::vector<int64_t>>();
      const auto offsets = info.at("data_offsets").get<std::vector<uint64_t>>();
      SLIMPI_CHECK(offsets.size() == 2, "{}: tensor {} has {} data_offsets", path, name, offsets.size());
      e.begin = data_start + offsets[0];
      e.end = data_start + offsets[1];
    } catch (const nlohmann::json::exception& ex) {
      SLIMPI_FAIL("{}: tensor {}: malformed entry: {}", path, name, ex.what());
    }
    uint64_t bytes = c10::elementSize(e.dtype);
    for (int64_t s : e.shape) bytes *= static_cast<uint64_t>(s);
    SLIMPI_CHECK(e.end >= e.begin && e.end - e.begin == bytes && e.end <= file_size,
                 "{}: tensor {} has data_offsets inconsistent with its shape or the file size", path, name);
    out.emplace(name, std::move(e));
  }
  return out;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

// A read-only memory map of one whole file.
struct SafetensorsReader::Mapping {
  void* data = MAP_FAILED;
  size_t size = 0;
  explicit Mapping(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    SLIMPI_CHECK(fd >= 0, "cannot open {}: {}", path, std::strerror(errno));
    struct stat st {};
    const bool sized = ::fstat(fd, &st) == 0;
    size = sized ? size_t(st.st_size) : 0;
    data = sized && size ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
    const int err = errno;
    ::close(fd);
    SLIMPI_CHECK(sized && data != MAP_FAILED, "cannot map {}: {}", path, std::strerror(err));
  }
  ~Mapping() {
    if (data && data != MAP_FAILED) ::munmap(data, size);
  }
};

SafetensorsReader::SafetensorsReader(const std::string& path) {
  namespace fs = std::filesystem;
  std::string index;
  if (fs::is_directory(path)) {
    if (fs::exists(fs::path(path) / "model.safetensors")) {
      entries_ = read_header((fs::path(path) / "model.safetensors").string());
      description_ = (fs::path(path) / "model.safetensors").string();
      return;
    }
    index = (fs::path(path) / "model.safetensors.index.json").string();
    SLIMPI_CHECK(fs::exists(index), "{} holds neither model.safetensors nor model.safetensors.index.json", path);
  } else if (ends_with(path, ".json")) {
    index = path;
  } else {
    SLIMPI_CHECK(fs::exists(path), "{} does not exist", path);
    entries_ = read_header(path);
    description_ = path;
    return;
  }
  nlohmann::json j;
  try {
    std::ifstream in(index);
    SLIMPI_CHECK(in, "cannot read {}", index);
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    SLIMPI_FAIL("{}: not valid JSON: {}", index, e.what());
  }
  SLIMPI_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), "{}: no \"weight_map\" object", index);
  const fs::path dir = fs::path(index).parent_path();
  std::set<std::string> shards;
  for (const auto& [name, shard] : j["weight_map"].items()) {
    SLIMPI_CHECK(shard.is_string(), "{}: weight_map[\"{}\"] is not a file name", index, name);
    shards.insert(shard.get<std::string>());
  }
  std::map<std::string, std::map<std::string, Entry>> headers;
  for (const auto& shard : shards) {
    const std::string file = (dir / shard).string();
    SLIMPI_CHECK(fs::exists(file), "{} names shard {}, which does not exist", index, file);
    headers[shard] = read_header(file);
  }
  for (const auto& [name, shard] : j["weight_map"].items()) {
    auto& h = headers[shard.get<std::string>()];
    auto it = h.find(name);
    SLIMPI_CHECK(it != h.end(), "{} maps {} to {}, which does not hold it", index, name, shard.get<std::string>());
    entries_.emplace(name, it->second);
  }
  description_ = fmt::format("{} ({} shards)", index, shards.size());
}

SafetensorsReader::~SafetensorsReader() = default;

at::Tensor SafetensorsReader::read(const std::string& name) const {
  auto it = entries_.find(name);
  SLIMPI_CHECK(it != entries_.end(), "{} has no tensor {}", description_, name);
  const Entry& e = it->second;
  auto& map = maps_[e.file];
  if (!map) map = std::make_unique<Mapping>(e.file);
  SLIMPI_CHECK(e.end <= map->size, "{}: tensor {} ends at byte {} but the file now has {} (changed since it was opened?)",
               e.file, name, e.end, map->size);
  at::Tensor out = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  if (e.end > e.begin) std::memcpy(out.data_ptr(), static_cast<const char*>(map->data) + e.begin, e.end - e.begin);
  return out;
}

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
  // Written under a temporary name and renamed when complete: a failed write (a full
  // disk) leaves no truncated file under `path` for a loader to trip on.
  const std::string partial = path + ".partial";
  try {
    FileWriter out(partial);
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    out.write(len, 8);
    out.write(text);
    for (const auto& c : cpu) out.write(c.data_ptr(), static_cast<size_t>(c.numel() * c.element_size()));
    out.close();
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(partial, path, ec);
  SLIMPI_CHECK(!ec, "cannot rename {} to {}: {}", partial, path, ec.message());
}

std::vector<NamedTensor> read_safetensors(const std::string& path) {
  SafetensorsReader reader(path);
  std::vector<NamedTensor> out;
  for (const auto& [name, e] : reader.entries()) out.push_back({name, reader.read(name)});
  return out;
}

}  // namespace slimpi
