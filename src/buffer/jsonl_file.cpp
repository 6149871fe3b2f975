#include "buffer/jsonl_file.h"

#include <slimpi/error.h>

#include <nlohmann/json.hpp>

#include <fstream>

namespace slimpi {

std::vector<JsonlRecord> read_jsonl(const std::string& path, const std::vector<std::string>& keys) {
  std::ifstream in(path);
  if (!in) SLIMPI_FAIL_ALL("cannot open data file '{}' (data.path)", path);
  std::vector<JsonlRecord> out;
  std::string text;
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      SLIMPI_FAIL_ALL("{}:{}: not valid JSON ({})", path, line, e.what());
    }
    if (!j.is_object()) SLIMPI_FAIL_ALL("{}:{}: expected a JSON object per line, got {}", path, line, j.type_name());
    JsonlRecord r;
    r.line = line;
    for (const auto& key : keys) {
      auto it = j.find(key);
      if (it == j.end()) SLIMPI_FAIL_ALL("{}:{}: missing key '{}'", path, line, key);
      if (!it->is_string())
        SLIMPI_FAIL_ALL("{}:{}: key '{}' must be a string, got {}", path, line, key, it->type_name());
      r.fields.push_back(it->get<std::string>());
    }
    out.push_back(std::move(r));
  }
  if (out.empty()) SLIMPI_FAIL_ALL("data file '{}' has no records", path);
  return out;
}

}  // namespace slimpi
