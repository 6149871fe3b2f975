#include "data/jsonl_file.h"

#include <slimpi/error.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>

namespace slimpi {

std::vector<JsonlRecord> read_jsonl(const std::string& path, const std::vector<std::string>& keys,
                                    bool skip_bad_lines, int64_t* n_skipped,
                                    const std::vector<std::string>& optional_keys,
                                    const std::vector<std::string>& json_keys) {
  auto listed = [](const std::vector<std::string>& list, const std::string& key) {
    return std::find(list.begin(), list.end(), key) != list.end();
  };
  std::ifstream in(path);
  if (!in) SLIMPI_FAIL_ALL("cannot open data file '{}'", path);
  std::vector<JsonlRecord> out;
  std::string text;
  int64_t skipped = 0;
  auto bad = [&](const std::string& message) {
    if (!skip_bad_lines) SLIMPI_FAIL_ALL("{}", message);
    ++skipped;
  };
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      bad(fmt::format("{}:{}: not valid JSON", path, line));
      continue;
    }
    if (!j.is_object()) {
      bad(fmt::format("{}:{}: expected a JSON object per line, got {}", path, line, j.type_name()));
      continue;
    }
    JsonlRecord r;
    r.line = line;
    std::string problem;
    for (const auto& key : keys) {
      auto it = j.find(key);
      const bool optional = listed(optional_keys, key);
      if (it == j.end() && !optional) {
        problem = fmt::format("{}:{}: missing key '{}'", path, line, key);
        break;
      }
      if (it != j.end() && !it->is_string() && !optional && !listed(json_keys, key)) {
        problem = fmt::format("{}:{}: key '{}' must be a string, got {}", path, line, key, it->type_name());
        break;
      }
      const bool as_json = it != j.end() && !it->is_string();  // metadata / a message list: any JSON value
      r.fields.push_back(it == j.end() ? std::string() : as_json ? it->dump() : it->get<std::string>());
      r.raw_json.push_back(as_json);
      r.present.push_back(it != j.end());
    }
    if (!problem.empty()) {
      bad(problem);
      continue;
    }
    out.push_back(std::move(r));
  }
  if (n_skipped) *n_skipped = skipped;
  if (out.empty()) SLIMPI_FAIL_ALL("data file '{}' has no records", path);
  return out;
}

}  // namespace slimpi
