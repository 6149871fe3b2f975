// Schema — every deck key: its type, default, range or choices, unit and one-line help.
// Each folder declares the keys its code reads (deck/key_tables.h: <folder>_keys.cpp);
// the Schema holds them all, gathered once (a static table). Read by the deck loader,
// by `slimpi keys`, and by the typed configs of each subsystem.
// Invariant: every key is "table.name" (snake_case), and every default satisfies its
// own range/choices (checked by a unit test).
#pragma once

#include <slimpi/deck.h>

#include <optional>
#include <string>
#include <vector>

namespace slimpi {

enum class KeyType { Int, Float, Bool, String, StringList };

const char* key_type_name(KeyType type);

struct KeySpec {
  std::string key;  // "rollout.top_p"
  KeyType type;
  DeckValue default_value;
  std::optional<double> min;  // inclusive, numeric keys only
  std::optional<double> max;  // inclusive
  std::vector<std::string> choices;  // string keys only; empty = free text
  std::string unit;                  // "s", "tokens", "" ...
  std::string help;
};

class Schema {
 public:
  static const Schema& instance();

  const std::vector<KeySpec>& keys() const { return keys_; }
  const KeySpec* find(const std::string& key) const;
  // True when `prefix` names a table of the schema ("run", "reward.command").
  bool is_table(const std::string& prefix) const;
  // The valid key nearest to `key` by edit distance, or "" when none is close.
  std::string nearest_key(const std::string& key) const;

 private:
  Schema();
  std::vector<KeySpec> keys_;
};

// Checks a value's type, range and choices against its spec. An integer for a float
// key is widened in place (exact, not coercion); any other mismatch is a problem.
// Returns the problem ("key 'x' must be an integer, got string \"3\"") or nullopt.
std::optional<std::string> check_deck_value(const KeySpec& spec, DeckValue& value);

// Formats a value the way TOML writes it ("abc" quoted, 1.0 with a point, [..]).
std::string format_deck_value(const DeckValue& value);
// "integer", "float", ... : the type of a value, for error messages.
std::string deck_value_type_name(const DeckValue& value);

}  // namespace slimpi
