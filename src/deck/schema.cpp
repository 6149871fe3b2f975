#include "deck/schema.h"

#include "deck/key_tables.h"

#include <slimpi/error.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace slimpi {
namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

const char* key_type_name(KeyType type) {
  switch (type) {
    case KeyType::Int: return "integer";
    case KeyType::Float: return "float";
    case KeyType::Bool: return "boolean";
    case KeyType::String: return "string";
    case KeyType::StringList: return "array of strings";
  }
  return "?";
}

std::string deck_value_type_name(const DeckValue& value) {
  static const KeyType order[] = {KeyType::Int, KeyType::Float, KeyType::Bool, KeyType::String,
                                  KeyType::StringList};
  return key_type_name(order[value.index()]);
}

std::string format_deck_value(const DeckValue& value) {
  struct Formatter {
    std::string operator()(int64_t v) const { return fmt::format("{}", v); }
    std::string operator()(double v) const {
      if (std::isnan(v)) return "nan";
      if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
      std::string s = fmt::format("{}", v);
      if (s.find_first_of(".e") == std::string::npos) s += ".0";
      return s;
    }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(const std::string& v) const {
      std::string out = "\"";
      for (char c : v) {
        switch (c) {
          case '"': out += "\\\""; break;
          case '\\': out += "\\\\"; break;
          case '\n': out += "\\n"; break;
          case '\t': out += "\\t"; break;
          default: out += c;
        }
      }
      return out + "\"";
    }
    std::string operator()(const std::vector<std::string>& v) const {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + (*this)(v[i]);
      return out + "]";
    }
  };
  return std::visit(Formatter{}, value);
}

std::optional<std::string> check_deck_value(const KeySpec& spec, DeckValue& value) {
  bool type_ok = false;
  switch (spec.type) {
    case KeyType::Int: type_ok = std::holds_alternative<int64_t>(value); break;
    case KeyType::Float:
      if (auto* i = std::get_if<int64_t>(&value)) value = static_cast<double>(*i);
      type_ok = std::holds_alternative<double>(value);
      break;
    case KeyType::Bool: type_ok = std::holds_alternative<bool>(value); break;
    case KeyType::String: type_ok = std::holds_alternative<std::string>(value); break;
    case KeyType::StringList: type_ok = std::holds_alternative<std::vector<std::string>>(value); break;
  }
  if (!type_ok)
    return fmt::format("key '{}' must be {} {}, got {} {}", spec.key,
                       spec.type == KeyType::Int ? "an" : "a", key_type_name(spec.type),
                       deck_value_type_name(value), format_deck_value(value));
  if (spec.min || spec.max) {
    double x = spec.type == KeyType::Int ? static_cast<double>(std::get<int64_t>(value))
                                         : std::get<double>(value);
    if ((spec.min && !(x >= *spec.min)) || (spec.max && !(x <= *spec.max)))
      return fmt::format("key '{}' = {} is out of range [{}, {}]{}", spec.key,
                         format_deck_value(value), spec.min ? fmt::format("{:g}", *spec.min) : "-inf",
                         spec.max ? fmt::format("{:g}", *spec.max) : "inf",
                         spec.unit.empty() ? "" : " " + spec.unit);
  }
  if (!spec.choices.empty()) {
    const auto& s = std::get<std::string>(value);
    if (std::find(spec.choices.begin(), spec.choices.end(), s) == spec.choices.end())
      return fmt::format("key '{}' = \"{}\" is not one of: {}", spec.key, s,
                         fmt::join(spec.choices, ", "));
  }
  return std::nullopt;
}

Schema::Schema() : keys_(deck_keys()) {}

const Schema& Schema::instance() {
  static const Schema schema;
  return schema;
}

const KeySpec* Schema::find(const std::string& key) const {
  for (const auto& spec : keys_)
    if (spec.key == key) return &spec;
  return nullptr;
}

bool Schema::is_table(const std::string& prefix) const {
  for (const auto& spec : keys_)
    if (spec.key.size() > prefix.size() && spec.key.compare(0, prefix.size(), prefix) == 0 &&
        spec.key[prefix.size()] == '.')
      return true;
  return false;
}

std::string Schema::nearest_key(const std::string& key) const {
  // Compare whole dotted names, and the last part alone (a key put in the wrong table:
  // "rollout.seed" -> "run.seed"); keep the closest within a third of the length.
  auto leaf = [](const std::string& k) { return k.substr(k.rfind('.') + 1); };
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const auto& spec : keys_) {
    size_t d = std::min(edit_distance(key, spec.key), edit_distance(leaf(key), leaf(spec.key)) + 1);
    if (d < best_distance) {
      best_distance = d;
      best = spec.key;
    }
  }
  size_t limit = std::max<size_t>(2, leaf(key).size() / 3);
  return best_distance <= limit ? best : "";
}

}  // namespace slimpi
