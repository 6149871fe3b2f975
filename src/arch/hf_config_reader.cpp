#include "arch/hf_config_reader.h"

#include <stdexcept>

namespace slimpi {

bool HfConfigReader::has(const std::string& key) const {
  for (const auto& k : keys)
    if (std::get<0>(k) == key) return true;
  return false;
}

void HfConfigReader::set(const std::string& key, DeckValue v, const std::string& field) {
  for (auto& k : keys)
    if (std::get<0>(k) == key) {
      k = {key, std::move(v), field};
      return;
    }
  keys.emplace_back(key, std::move(v), field);
}

void HfConfigReader::required(const nlohmann::json& c, const char* field, const char* key) {
  if (auto v = get_int(c, field); v && *v > 0) set(key, *v, field);
  else if (v) fail("'{}' = {} must be positive", field, *v);
  else fail("no '{}'", field);
}

std::optional<int64_t> get_int(const nlohmann::json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) throw std::runtime_error(fmt::format("'{}' must be an integer", field));
  return it->get<int64_t>();
}

std::optional<double> get_float(const nlohmann::json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) throw std::runtime_error(fmt::format("'{}' must be a number", field));
  return it->get<double>();
}

std::optional<bool> get_bool(const nlohmann::json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) throw std::runtime_error(fmt::format("'{}' must be true or false", field));
  return it->get<bool>();
}

}  // namespace slimpi
