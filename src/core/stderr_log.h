// StderrLog — a child process's stderr (ChildProcess with capture_stderr) into the job's
// log: whole lines, prefixed "[<label> stderr]", up to `cap` bytes since reset() (empty
// lines skipped); past the cap the rest is read and dropped, one line says so, and its
// last 2 KB are kept and logged by a final drain ("[<label> stderr, last lines]": the
// last words before a restart or the end, say a traceback). A drain reads a bounded
// number of chunks, so a process that never stops writing cannot hold its caller.
// Owned by whoever owns the ChildProcess (an environment process, a reward command);
// single-threaded.
#pragma once

#include <cstdint>
#include <string>

namespace slimpi {

class ChildProcess;

class StderrLog {
 public:
  // cap_key: the deck key that sets `cap`, named when the cap is reached.
  StderrLog(std::string label, int64_t cap, std::string cap_key)
      : label_(std::move(label)), cap_(cap), cap_key_(std::move(cap_key)) {}
  // A new process (its own cap); what was kept of the last one is dropped.
  void reset();
  // Reads what `child` wrote to stderr (nothing if it has no stderr pipe) and logs whole
  // lines within the cap. final: also the unfinished line, or the kept tail's lines.
  void drain(ChildProcess& child, bool final = false);

 private:
  void keep_tail();
  void say_capped();

  std::string label_;
  int64_t cap_;
  std::string cap_key_;
  std::string buf_;         // read, not yet a whole line (past the cap: its last 2 KB)
  int64_t logged_ = 0;      // bytes logged since reset()
  bool capped_ = false;     // the cap was reached and said
  bool tail_cut_ = false;   // the kept tail was cut: its first line is a fragment
};

}  // namespace slimpi
