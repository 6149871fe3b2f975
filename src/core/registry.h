// Registry<T> — the one shape of every extension point (reward styles, advantage
// estimators, policy losses, dynamic filters, LR schedules), after LAMMPS' style
// registry: entries keyed by the exact string the deck uses, so adding a style is one
// add() in its own file, and the deck schema takes its `choices` from names().
// An unknown name is an error that lists the valid ones. Built once (a function-local
// static per extension point), read-only afterwards; lookups are thread-safe.
#pragma once

#include <slimpi/error.h>

#include <fmt/ranges.h>

#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace slimpi {

template <class T>
class Registry {
 public:
  // what: the deck key or a phrase naming the extension point, for error messages.
  explicit Registry(std::string what) : what_(std::move(what)) {}
  // A registry of fixed entries (an enum's deck names): Registry<Mode>("x.mode", {{"a", Mode::A}, ...}).
  Registry(std::string what, std::initializer_list<std::pair<std::string, T>> entries) : what_(std::move(what)) {
    for (const auto& [name, entry] : entries) add(name, entry);
  }

  Registry& add(const std::string& name, T entry) {
    SLIMPI_CHECK(entries_.emplace(name, std::move(entry)).second, "{}: '{}' registered twice", what_, name);
    return *this;
  }
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  const T& get(const std::string& name) const {
    auto it = entries_.find(name);
    SLIMPI_CHECK(it != entries_.end(), "unknown {} '{}'; valid: {}", what_, name, fmt::join(names(), ", "));
    return it->second;
  }
  // Registered names, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, entry] : entries_) out.push_back(name);
    return out;
  }

 private:
  std::string what_;
  std::map<std::string, T> entries_;
};

}  // namespace slimpi
