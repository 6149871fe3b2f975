#include "core/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace slimpi::log {
namespace {

struct LogState {
  int rank = 0;
  int size = 1;
  std::shared_ptr<spdlog::logger> out;
  std::shared_ptr<spdlog::logger> err;

  LogState() {
    out = std::make_shared<spdlog::logger>("slimpi",
                                           std::make_shared<spdlog::sinks::stdout_sink_mt>());
    err = std::make_shared<spdlog::logger>("slimpi-err",
                                           std::make_shared<spdlog::sinks::stderr_sink_mt>());
    for (auto* l : {out.get(), err.get()}) {
      l->set_pattern("[%Y-%m-%d %H:%M:%S.%e] %v");
      l->flush_on(spdlog::level::trace);
    }
  }
};

LogState& state() {
  static LogState s;
  return s;
}

std::string tagged(const char* level, const std::string& text) {
  return fmt::format("[rank {}] {}: {}", state().rank, level, text);
}

}  // namespace

void init(int world_rank, int world_size) {
  state().rank = world_rank;
  state().size = world_size;
}

bool is_root() { return state().rank == 0; }

void info_text(const std::string& text) {
  if (is_root()) state().out->info(text);
}
void warn_text(const std::string& text) { state().err->warn(tagged("warning", text)); }
void error_text(const std::string& text) { state().err->error(tagged("error", text)); }
void all_text(const std::string& text) { state().out->info(fmt::format("[rank {}] {}", state().rank, text)); }

}  // namespace slimpi::log
