#include "core/stderr_log.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string_view>

#include "core/child_process.h"
#include "core/log.h"
#include "core/printable.h"

namespace slimpi {
namespace {
constexpr size_t kTail = 2048;  // past the cap: the last bytes kept
}  // namespace

void StderrLog::reset() {
  buf_.clear();
  logged_ = 0;
  capped_ = false;
  tail_cut_ = false;
}

void StderrLog::keep_tail() {
  if (buf_.size() <= kTail) return;
  buf_.erase(0, buf_.size() - kTail);
  tail_cut_ = true;
}

void StderrLog::say_capped() {
  capped_ = true;
  log::warn("[{} stderr] more than {} = {} bytes since its start: the rest is dropped (its last lines are logged "
            "if it is restarted or ends)", label_, cap_key_, cap_);
}

void StderrLog::drain(ChildProcess& child, bool final) {
  const int reads_per_call = final ? 64 : 16;
  char chunk[65536];
  for (int reads = 0; reads < reads_per_call && child.stderr_fd() >= 0; ++reads) {
    const ssize_t r = read(child.stderr_fd(), chunk, sizeof(chunk));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) child.close_stderr();  // closed: it is exiting
    if (r <= 0) break;                 // (or EAGAIN: nothing more now)
    buf_.append(chunk, size_t(r));
    // Whole lines within the cap are logged; the first that does not fit sets the cap and
    // stays, with what follows, in the kept tail.
    for (size_t nl; !capped_ && (nl = buf_.find('\n')) != std::string::npos;) {
      if (logged_ + int64_t(nl) > cap_) {
        say_capped();
        break;
      }
      if (nl > 0) log::warn("[{} stderr] {}", label_, printable_excerpt(buf_.substr(0, nl), nl));
      logged_ += int64_t(nl);
      buf_.erase(0, nl + 1);
    }
    if (!capped_ && logged_ + int64_t(buf_.size()) > cap_) say_capped();  // one endless line
    if (capped_) keep_tail();
  }
  if (!final || buf_.empty()) return;
  std::string_view rest(buf_);
  if (tail_cut_) rest.remove_prefix(std::min(rest.size(), rest.find('\n') + 1));
  const char* kind = capped_ ? " stderr, last lines" : " stderr";
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    const std::string line(rest.substr(0, nl));
    if (!line.empty()) log::warn("[{}{}] {}", label_, kind, printable_excerpt(line, line.size()));
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
  }
  buf_.clear();
  tail_cut_ = false;
}

}  // namespace slimpi
