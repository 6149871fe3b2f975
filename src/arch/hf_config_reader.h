// HfConfigReader — a Hugging Face config.json on its way to deck keys: the values read
// (each with the config field it came from, so deck.resolved.toml can say so) and what
// is wrong with the config (each problem names the file). Filled by config/hf_config.cpp
// (the fields every family has) and by the family's Architecture::read_config
// (arch/architecture.h). A plain value, one per config.json read.
#pragma once

#include <fmt/format.h>
#include <slimpi/deck.h>

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace slimpi {

struct HfConfigReader {
  std::string file;
  std::vector<std::tuple<std::string, DeckValue, std::string>> keys;  // deck key, value, config field
  std::vector<std::string> problems;

  // Whether deck key `key` was set.
  bool has(const std::string& key) const;
  // Sets deck key `key` (a later call for the same key wins).
  void set(const std::string& key, DeckValue v, const std::string& field);
  template <class... A>
  void fail(fmt::format_string<A...> f, A&&... a) {
    problems.push_back(file + ": " + fmt::format(f, std::forward<A>(a)...));
  }
  // Field `field` of `c`, a positive integer, as deck key `key`; a problem when absent or not positive.
  void required(const nlohmann::json& c, const char* field, const char* key);
};

// A field's value, nullopt when absent or null; a value of another type throws.
std::optional<int64_t> get_int(const nlohmann::json& j, const char* field);
std::optional<double> get_float(const nlohmann::json& j, const char* field);
std::optional<bool> get_bool(const nlohmann::json& j, const char* field);

}  // namespace slimpi
