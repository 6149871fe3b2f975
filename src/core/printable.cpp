#include "core/printable.h"

#include <fmt/format.h>

#include <algorithm>

namespace slimpi {

std::string printable_excerpt(const std::string& text, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < std::min(text.size(), max_bytes); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') out += char(c);
    else out += fmt::format("\\x{:02x}", c);
  }
  if (text.size() > max_bytes) out += "...";
  return out;
}

}  // namespace slimpi
