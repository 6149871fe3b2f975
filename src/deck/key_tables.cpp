#include "deck/key_tables.h"

#include <utility>

namespace slimpi {

KeySpec int_key(std::string key, int64_t def, double lo, double hi, std::string unit, std::string help) {
  return {std::move(key), KeyType::Int, def, lo, hi, {}, std::move(unit), std::move(help)};
}
KeySpec float_key(std::string key, double def, double lo, double hi, std::string unit, std::string help) {
  return {std::move(key), KeyType::Float, def, lo, hi, {}, std::move(unit), std::move(help)};
}
KeySpec string_key(std::string key, std::string def, std::string help) {
  return {std::move(key), KeyType::String, std::move(def), {}, {}, {}, "", std::move(help)};
}
KeySpec bool_key(std::string key, bool def, std::string help) {
  return {std::move(key), KeyType::Bool, def, {}, {}, {}, "", std::move(help)};
}
KeySpec choice_key(std::string key, std::string def, std::vector<std::string> choices, std::string help) {
  return {std::move(key), KeyType::String, std::move(def), {}, {}, std::move(choices), "", std::move(help)};
}

std::vector<std::string> with_auto(std::vector<std::string> names) {
  names.insert(names.begin(), "auto");
  return names;
}

}  // namespace slimpi
