// Logging for an SPMD job. Role: the only place slimpi prints from.
//   log::info(...)  rank 0 only, timestamped, to stdout (progress, layouts, metrics)
//   log::warn(...)  any rank, tagged "[rank r]", to stderr
//   log::error(...) any rank, tagged, to stderr
//   log::all(...)   every rank prints, tagged (start-up diagnostics)
// init() must run once after MPI_Init; before it, every rank prints as if it were rank 0.
#pragma once

#include <fmt/format.h>

#include <string>

namespace slimpi::log {

void init(int world_rank, int world_size);
bool is_root();

void info_text(const std::string& text);
void warn_text(const std::string& text);
void error_text(const std::string& text);
void all_text(const std::string& text);

template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (is_root()) info_text(fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  warn_text(fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  error_text(fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void all(fmt::format_string<Args...> f, Args&&... args) {
  all_text(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace slimpi::log
