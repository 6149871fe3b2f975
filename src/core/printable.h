// printable_excerpt — a piece of untrusted text (a model's response, a child process's
// output) made safe for a log line or an error message.
#pragma once

#include <cstddef>
#include <string>

namespace slimpi {

// The first `max_bytes` of `text`: printable ASCII kept, every other byte as \xNN
// (responses are raw bytes; a terminal or the launcher's message forwarding must not see
// them), "..." when cut.
std::string printable_excerpt(const std::string& text, size_t max_bytes = 60);

}  // namespace slimpi
