// slimpi::Error — the one exception type every slimpi failure throws.
//
// Usage:
//   SLIMPI_CHECK(n_steps > 0, "run.n_steps must be positive, got {}", n_steps);
//   SLIMPI_FAIL("cannot open {}: {}", path, reason);
//   SLIMPI_FAIL_ALL("...")   // an error that every rank detects identically
//
// The macros add the source location. main() reports an error marked `collective`
// once (rank 0) and exits cleanly on every rank; any other error is one rank's: it is
// printed with that rank's number and the whole job is aborted (no hang).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace slimpi {

class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const char* file, int line, bool collective = false)
      : std::runtime_error(message), where_(fmt::format("{}:{}", file, line)),
        collective_(collective) {}

  // "src/config/deck.cpp:120": where in slimpi's source the error was raised.
  const std::string& where() const { return where_; }
  // True when every rank raises the same error at the same point (no abort needed).
  bool collective() const { return collective_; }

 private:
  std::string where_;
  bool collective_;
};

}  // namespace slimpi

#define SLIMPI_FAIL(...) throw ::slimpi::Error(fmt::format(__VA_ARGS__), __FILE__, __LINE__)
#define SLIMPI_FAIL_ALL(...) \
  throw ::slimpi::Error(fmt::format(__VA_ARGS__), __FILE__, __LINE__, /*collective=*/true)
#define SLIMPI_CHECK(cond, ...)  \
  do {                           \
    if (!(cond)) {               \
      SLIMPI_FAIL(__VA_ARGS__);  \
    }                            \
  } while (0)
