// slimpi::Deck — an experiment's resolved input deck: every key of the schema with its
// value and where that value came from (file:line, --set, or the schema default).
//
// Usage:
//   Deck deck = load_deck("inputs/quickstart.toml", {"run.n_steps=3"});  // one process
//   int64_t steps = deck.get_int("run.n_steps");
//   std::string where = deck.source("run.n_steps");   // "--set" / "inputs/x.toml:4"
//
// A deck is immutable once loaded; the accessors throw when asked for a key the schema
// does not declare or with the wrong type (a programming error, not a user error).
// Decks are TOML, one table per subsystem; `include = ["base.toml"]` merges base decks
// (relative to the including file) under the including one; --set overrides come last.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace slimpi {

using DeckValue = std::variant<int64_t, double, bool, std::string, std::vector<std::string>>;

struct DeckEntry {
  DeckValue value;
  std::string source;  // "path/deck.toml:12", "--set", or "default"
};

class Deck {
 public:
  Deck() = default;
  explicit Deck(std::map<std::string, DeckEntry> entries) : entries_(std::move(entries)) {}

  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  const std::vector<std::string>& get_strings(const std::string& key) const;
  const std::string& source(const std::string& key) const;
  bool is_default(const std::string& key) const { return source(key) == "default"; }
  // The key holds its schema default value, wherever it was written (a resolved deck
  // writes every key): what "a key that would be ignored is set" checks ask.
  bool has_default_value(const std::string& key) const;

  const std::map<std::string, DeckEntry>& entries() const { return entries_; }

  // The resolved deck as TOML, one table per subsystem, each value commented with its
  // source. Parsing this text gives back the same values.
  std::string to_toml() const;
  // Lossless JSON form, used to broadcast a deck from rank 0.
  std::string to_json() const;
  static Deck from_json(const std::string& text);

 private:
  const DeckEntry& entry(const std::string& key) const;
  std::map<std::string, DeckEntry> entries_;
};

// Reads `path` (following includes), applies `overrides` ("key=value"), fills defaults
// and validates every key against the schema. Throws slimpi::Error listing every
// problem found (unknown keys with the nearest valid key, wrong types, ranges) with
// file:line. Single-process; src/config/deck_loader.cpp has the MPI-collective version
// (load_deck_collective, declared in config/deck_broadcast.h).
Deck load_deck(const std::string& path, const std::vector<std::string>& overrides);

}  // namespace slimpi
