#include "ckpt/checkpoint_dir.h"

#include "deck/schema.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <slimpi/error.h>

#include "core/file_write.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace slimpi::ckpt {
namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "step_";
constexpr const char* kDone = "DONE";
constexpr const char* kManifest = "manifest.json";

// Flushes a file or directory to stable storage (a crash after this keeps it).
void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

std::string step_dir_name(int64_t step) { return fmt::format("{}{:08d}", kPrefix, step); }

std::optional<int64_t> parse_step_dir_name(const std::string& name) {
  const std::string prefix = kPrefix;
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const std::string digits = name.substr(prefix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) || digits.size() > 15)
    return std::nullopt;
  return std::stoll(digits);
}

std::vector<int64_t> list_step_dirs(const std::string& root) {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return steps;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory())
      if (auto s = parse_step_dir_name(e.path().filename().string())) steps.push_back(*s);
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

std::string file_xxh64(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SLIMPI_CHECK(in, "cannot read {} for its checksum", path);
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    XXH64_update(state, buf.data(), static_cast<size_t>(in.gcount()));
  }
  const XXH64_hash_t h = XXH64_digest(state);
  XXH64_freeState(state);
  return fmt::format("{:016x}", static_cast<unsigned long long>(h));
}

void write_manifest(const std::string& dir, const std::vector<std::string>& files) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& name : files) {
    const std::string path = dir + "/" + name;
    list.push_back({{"name", name}, {"bytes", fs::file_size(path)}, {"xxh64", file_xxh64(path)}});
    fsync_path(path);
  }
  FileWriter out(dir + "/" + kManifest);
  out.write(nlohmann::json{{"files", list}}.dump(2) + "\n");
  out.sync();
  out.close();
}

void write_checkpoint_file(const std::string& path, const std::string& text) { write_file(path, text); }

void write_done_marker(const std::string& dir, int64_t step) {
  FileWriter out(dir + "/" + kDone);
  out.write(fmt::format("slimpi checkpoint complete: resumes at step {}\n", step));
  out.sync();
  out.close();
  fsync_path(dir);
}

Deck read_checkpoint_deck(const std::string& dir) {
  const std::string path = dir + "/deck.json";
  std::ifstream in(path);
  SLIMPI_CHECK(in, "cannot read {}", path);
  std::stringstream text;
  text << in.rdbuf();
  // A checkpoint written before a key existed ran with that key's default behaviour:
  // fill it in (tokenizer.path: the byte tokenizer), so every reader sees a whole deck.
  std::map<std::string, DeckEntry> entries = Deck::from_json(text.str()).entries();
  for (const auto& spec : Schema::instance().keys())
    if (!entries.count(spec.key))
      entries[spec.key] = {spec.key == "tokenizer.path" ? DeckValue(std::string("bytes")) : spec.default_value,
                           "default"};
  return Deck(std::move(entries));
}

bool is_unfinished_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && !fs::exists(dir + "/" + kDone, ec);
}

std::optional<std::string> verify_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "no such directory";
  if (!fs::exists(dir + "/" + kDone, ec)) return "no DONE marker (the checkpoint was not finished)";
  nlohmann::json manifest;
  try {
    std::ifstream in(dir + "/" + kManifest);
    if (!in) return std::string("no ") + kManifest;
    manifest = nlohmann::json::parse(in);
    if (!manifest.contains("files") || !manifest["files"].is_array() || manifest["files"].empty())
      return std::string(kManifest) + " lists no files";
    for (const auto& f : manifest["files"]) {
      const std::string name = f.at("name").get<std::string>();
      const std::string path = dir + "/" + name;
      if (!fs::exists(path, ec)) return name + ": missing";
      const uint64_t bytes = fs::file_size(path, ec);
      if (bytes != f.at("bytes").get<uint64_t>())
        return fmt::format("{}: {} bytes, the manifest says {}", name, bytes, f.at("bytes").get<uint64_t>());
      const std::string sum = file_xxh64(path);
      if (sum != f.at("xxh64").get<std::string>())
        return fmt::format("{}: checksum {} differs from the manifest's {}", name, sum,
                           f.at("xxh64").get<std::string>());
    }
  } catch (const nlohmann::json::exception& e) {
    return std::string(kManifest) + " is malformed: " + e.what();
  } catch (const slimpi::Error& e) {
    return e.what();
  }
  return std::nullopt;
}

std::vector<std::string> prune_checkpoints(const std::string& root, int64_t keep_last, int64_t keep_every) {
  std::vector<std::string> removed;
  int64_t complete_seen = 0;
  bool newer_complete = false;
  for (int64_t step : list_step_dirs(root)) {  // newest first
    const std::string dir = root + "/" + step_dir_name(step);
    std::error_code ec;
    const bool complete = fs::exists(dir + "/" + kDone, ec);
    bool remove = false;
    if (complete) {
      ++complete_seen;
      remove = keep_last > 0 && complete_seen > keep_last && !(keep_every > 0 && step % keep_every == 0);
      newer_complete = true;
    } else {
      remove = newer_complete;  // an unfinished write older than a finished one
    }
    if (remove) {
      fs::remove_all(dir, ec);
      if (!ec) removed.push_back(dir);
    }
  }
  return removed;
}

}  // namespace slimpi::ckpt
