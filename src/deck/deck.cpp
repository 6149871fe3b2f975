#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <nlohmann/json.hpp>

#include "deck/schema.h"

namespace slimpi {

const DeckEntry& Deck::entry(const std::string& key) const {
  auto it = entries_.find(key);
  SLIMPI_CHECK(it != entries_.end(), "deck has no key '{}' (not in the schema?)", key);
  return it->second;
}

namespace {
template <class T>
const T& typed(const DeckEntry& e, const std::string& key, const char* wanted) {
  const T* v = std::get_if<T>(&e.value);
  SLIMPI_CHECK(v, "deck key '{}' read as {} but holds a {}", key, wanted,
               deck_value_type_name(e.value));
  return *v;
}
}  // namespace

int64_t Deck::get_int(const std::string& key) const {
  return typed<int64_t>(entry(key), key, "integer");
}
double Deck::get_float(const std::string& key) const {
  const DeckEntry& e = entry(key);
  if (const auto* i = std::get_if<int64_t>(&e.value)) return static_cast<double>(*i);
  return typed<double>(e, key, "float");
}
bool Deck::get_bool(const std::string& key) const { return typed<bool>(entry(key), key, "boolean"); }
const std::string& Deck::get_string(const std::string& key) const {
  return typed<std::string>(entry(key), key, "string");
}
const std::vector<std::string>& Deck::get_strings(const std::string& key) const {
  return typed<std::vector<std::string>>(entry(key), key, "array of strings");
}
const std::string& Deck::source(const std::string& key) const { return entry(key).source; }

bool Deck::has_default_value(const std::string& key) const {
  const KeySpec* spec = Schema::instance().find(key);
  SLIMPI_CHECK(spec, "deck key '{}' is not in the schema", key);
  return entry(key).value == spec->default_value;
}

std::string Deck::to_toml() const {
  // Tables in schema order, one line per key: `name = value  # source`.
  std::string out;
  std::string table;
  for (const auto& spec : Schema::instance().keys()) {
    auto it = entries_.find(spec.key);
    if (it == entries_.end()) continue;
    std::string t = spec.key.substr(0, spec.key.rfind('.'));
    if (t != table) {
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", t);
      table = t;
    }
    out += fmt::format("{} = {}  # {}\n", spec.key.substr(t.size() + 1),
                       format_deck_value(it->second.value), it->second.source);
  }
  return out;
}

std::string Deck::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, e] : entries_) {
    nlohmann::json v;
    std::visit([&](const auto& x) { v = x; }, e.value);
    nlohmann::json item = nlohmann::json::object();
    item["type"] = e.value.index();
    item["value"] = std::move(v);
    item["source"] = e.source;
    j[key] = std::move(item);
  }
  return j.dump();
}

Deck Deck::from_json(const std::string& text) {
  std::map<std::string, DeckEntry> entries;
  const nlohmann::json all = nlohmann::json::parse(text);
  for (auto it = all.begin(); it != all.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& item = it.value();
    const auto& v = item.at("value");
    DeckValue value;
    switch (item.at("type").get<size_t>()) {
      case 0: value = v.get<int64_t>(); break;
      case 1: value = v.get<double>(); break;
      case 2: value = v.get<bool>(); break;
      case 3: value = v.get<std::string>(); break;
      default: value = v.get<std::vector<std::string>>(); break;
    }
    entries[key] = {std::move(value), item.at("source").get<std::string>()};
  }
  return Deck(std::move(entries));
}

}  // namespace slimpi
