// load_deck(): TOML files + includes + --set overrides -> a validated Deck.
//
// Order of precedence (last wins): schema defaults < included decks (in list order,
// depth first) < the including deck < --set overrides. Every problem is collected
// and reported in one pass, each line naming file:line and the key.
#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/hf_config.h"
#include "deck/schema.h"

namespace slimpi {
namespace {

namespace fs = std::filesystem;

// The validation problems found so far, each a full "where: what" line.
struct Problems {
  std::vector<std::string> lines;
  template <class... A>
  void add(fmt::format_string<A...> f, A&&... a) {
    lines.push_back(fmt::format(f, std::forward<A>(a)...));
  }
};

std::string unknown_key_message(const std::string& key) {
  std::string near = Schema::instance().nearest_key(key);
  std::string hint = near.empty() ? "" : fmt::format(" (did you mean {}?)", near);
  return fmt::format("unknown key '{}'{}; `slimpi keys` lists the valid keys", key, hint);
}

// Converts a TOML leaf into a DeckValue; nullopt (with a problem added) for TOML types
// the schema never uses (tables, dates, mixed arrays).
std::optional<DeckValue> to_deck_value(const toml::node& node, const std::string& where,
                                       const std::string& key, Problems& problems) {
  if (auto v = node.as_integer()) return DeckValue(v->get());
  if (auto v = node.as_floating_point()) return DeckValue(v->get());
  if (auto v = node.as_boolean()) return DeckValue(v->get());
  if (auto v = node.as_string()) return DeckValue(v->get());
  if (auto arr = node.as_array()) {
    std::vector<std::string> items;
    for (const auto& item : *arr) {
      if (!item.is_string()) {
        problems.add("{}: key '{}' must be an array of strings; element {} is not a string",
                     where, key, items.size());
        return std::nullopt;
      }
      items.push_back(*item.value<std::string>());
    }
    return DeckValue(std::move(items));
  }
  problems.add("{}: key '{}' has a TOML type slimpi does not use (date/time or table)", where, key);
  return std::nullopt;
}

// Checks one value against its spec; adds a problem at `where` and returns false if bad.
bool check_value(const KeySpec& spec, DeckValue& value, const std::string& where,
                 Problems& problems) {
  std::optional<std::string> problem = check_deck_value(spec, value);
  if (problem) problems.add("{}: {}", where, *problem);
  return !problem;
}

class DeckReader {
 public:
  std::map<std::string, DeckEntry> entries;
  Problems problems;

  void read_file(const fs::path& path, const std::string& included_from) {
    fs::path canonical = fs::weakly_canonical(path);
    if (std::find(stack_.begin(), stack_.end(), canonical) != stack_.end()) {
      problems.add("{}: include cycle: {} includes itself", included_from, path.string());
      return;
    }
    if (fs::is_directory(path)) {
      problems.add("{}deck file '{}' is a directory", included_from.empty() ? "" : included_from + ": ",
                   path.string());
      return;
    }
    std::ifstream in(path);
    if (!in) {
      problems.add("{}cannot open deck file '{}'",
                   included_from.empty() ? "" : included_from + ": ", path.string());
      return;
    }
    std::stringstream text;
    text << in.rdbuf();
    toml::table root;
    try {
      root = toml::parse(text.str(), path.string());
    } catch (const toml::parse_error& e) {
      problems.add("{}:{}:{}: TOML syntax error: {}", path.string(), e.source().begin.line,
                   e.source().begin.column, e.description());
      return;
    }
    stack_.push_back(canonical);
    read_includes(root, path);
    read_table(root, "", path.string());
    stack_.pop_back();
  }

  void apply_override(const std::string& text) {
    auto eq = text.find('=');
    if (eq == std::string::npos || eq == 0) {
      problems.add("--set {}: expected key=value (e.g. --set run.n_steps=10)", text);
      return;
    }
    std::string key = text.substr(0, eq);
    std::string raw = text.substr(eq + 1);
    const KeySpec* spec = Schema::instance().find(key);
    if (!spec) {
      problems.add("--set {}: {}", text, unknown_key_message(key));
      return;
    }
    std::optional<DeckValue> value;
    try {
      toml::table t = toml::parse("v = " + raw);
      value = to_deck_value(*t.get("v"), "--set " + text, key, problems);
    } catch (const toml::parse_error&) {
      // Shells strip quotes: a bare word is a string where the key wants a string.
      if (spec->type == KeyType::String) value = DeckValue(raw);
      else problems.add("--set {}: '{}' is not a TOML value for {} key '{}'", text, raw,
                        key_type_name(spec->type), key);
    }
    if (value && check_value(*spec, *value, "--set " + text, problems))
      entries[key] = {std::move(*value), "--set"};
  }

 private:
  std::vector<fs::path> stack_;

  void read_includes(const toml::table& root, const fs::path& path) {
    const toml::node* inc = root.get("include");
    if (!inc) return;
    std::string where = fmt::format("{}:{}", path.string(), inc->source().begin.line);
    const toml::array* list = inc->as_array();
    if (!list) {
      problems.add("{}: 'include' must be an array of file names, e.g. include = [\"base.toml\"]", where);
      return;
    }
    for (const auto& item : *list) {
      auto name = item.value<std::string>();
      if (!name) {
        problems.add("{}: 'include' entries must be strings", where);
        continue;
      }
      fs::path target = fs::path(*name).is_absolute() ? fs::path(*name)
                                                      : path.parent_path() / *name;
      read_file(target, where);
    }
  }

  void read_table(const toml::table& table, const std::string& prefix, const std::string& file) {
    // toml++ iterates keys alphabetically; visit them in file order so that problems
    // are reported top to bottom.
    std::vector<std::pair<std::string, const toml::node*>> items;
    for (const auto& [k, node] : table) items.emplace_back(std::string(k.str()), &node);
    std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
      return a.second->source().begin.line < b.second->source().begin.line;
    });
    for (const auto& [k, node_ptr] : items) {
      const toml::node& node = *node_ptr;
      std::string key = prefix.empty() ? k : prefix + "." + k;
      std::string where = fmt::format("{}:{}", file, node.source().begin.line);
      if (prefix.empty() && key == "include") continue;
      if (const toml::table* sub = node.as_table()) {
        read_table(*sub, key, file);
        continue;
      }
      const KeySpec* spec = Schema::instance().find(key);
      if (!spec) {
        problems.add("{}: {}", where, unknown_key_message(key));
        continue;
      }
      std::optional<DeckValue> value = to_deck_value(node, where, key, problems);
      if (value && check_value(*spec, *value, where, problems))
        entries[key] = {std::move(*value), where};
    }
  }
};

}  // namespace

Deck load_deck(const std::string& path, const std::vector<std::string>& overrides) {
  DeckReader reader;
  reader.read_file(path, "");
  for (const auto& o : overrides) reader.apply_override(o);
  for (const auto& spec : Schema::instance().keys())
    if (!reader.entries.count(spec.key)) reader.entries[spec.key] = {spec.default_value, "default"};
  if (reader.problems.lines.empty()) apply_hf_config(reader.entries, reader.problems.lines);  // [model] from config.json
  if (!reader.problems.lines.empty()) {
    std::string text = fmt::format("{} problem{} in deck {}:", reader.problems.lines.size(),
                                   reader.problems.lines.size() == 1 ? "" : "s", path);
    for (const auto& line : reader.problems.lines) text += "\n  " + line;
    SLIMPI_FAIL_ALL("{}", text);
  }
  return Deck(std::move(reader.entries));
}

}  // namespace slimpi
