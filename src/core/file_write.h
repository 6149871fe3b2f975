// Writing files so that a failed write (a full disk, a quota, a vanished directory) is
// an error naming the file and the system's reason, never a silently short file.
//
// FileWriter: POSIX open/write/close with every status checked (std::ofstream hides
// errno and is easy to leave unchecked). write_file(): a whole small file at once.
// disk_space_problem(): whether the file system holding a path is (nearly) out of
// space, for error messages and the watchdog (parallel/watchdog.h), which cannot see
// errno inside MPI-IO.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace slimpi {

class FileWriter {
 public:
  enum class Mode { Truncate, Append };
  // Opens (creates) `path`; throws "cannot write PATH: <reason>".
  explicit FileWriter(const std::string& path, Mode mode = Mode::Truncate);
  ~FileWriter();  // closes without checking: call close() to know the write landed
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t n);  // throws "cannot write PATH: <reason> (after N bytes)"
  void write(std::string_view text) { write(text.data(), text.size()); }
  void sync();   // fsync: on stable storage once this returns
  void close();  // throws when the close reports a failed write (NFS, quotas)

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

// The whole file at once (truncating); throws naming it.
void write_file(const std::string& path, std::string_view text);

// "no space left on device: 12 KiB free on the file system of PATH" when that file
// system has less than max(64 KiB, min(16 MiB, 0.1% of its size)) free for this
// process (root may use the reserved blocks), else nullopt. PATH need not exist yet:
// its nearest existing parent directory is asked.
std::optional<std::string> disk_space_problem(const std::string& path);

// Whether an error message says a write ran out of space: disk_space_problem()'s text,
// or the system's (strerror(ENOSPC), which FileWriter and HDF5's serial driver quote).
bool reports_no_space(const std::string& message);

}  // namespace slimpi
