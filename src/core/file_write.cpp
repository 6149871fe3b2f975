#include "core/file_write.h"

#include <fcntl.h>
#include <slimpi/error.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace slimpi {

FileWriter::FileWriter(const std::string& path, Mode mode) : path_(path) {
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (mode == Mode::Append ? O_APPEND : O_TRUNC);
  fd_ = ::open(path.c_str(), flags, 0644);
  SLIMPI_CHECK(fd_ >= 0, "cannot write {}: {}", path, std::strerror(errno));
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::write(const void* data, size_t n) {
  SLIMPI_CHECK(fd_ >= 0, "cannot write {}: already closed", path_);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    SLIMPI_CHECK(w > 0, "cannot write {}: {} (after {} bytes)", path_, w < 0 ? std::strerror(errno) : "no progress",
                 written_);
    p += w;
    n -= size_t(w);
    written_ += uint64_t(w);
  }
}

void FileWriter::sync() {
  SLIMPI_CHECK(fd_ >= 0 && ::fsync(fd_) == 0, "cannot write {}: fsync failed: {}", path_, std::strerror(errno));
}

void FileWriter::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  SLIMPI_CHECK(::close(fd) == 0, "cannot write {}: {}", path_, std::strerror(errno));
}

void write_file(const std::string& path, std::string_view text) {
  FileWriter out(path);
  out.write(text);
  out.close();
}

bool reports_no_space(const std::string& message) {
  static const std::string system_text = std::strerror(ENOSPC);  // "No space left on device"
  return message.find("no space left on device") != std::string::npos ||
         message.find(system_text) != std::string::npos;
}

std::optional<std::string> disk_space_problem(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path probe = fs::absolute(path, ec);
  while (!probe.empty() && !fs::exists(probe, ec) && probe != probe.parent_path()) probe = probe.parent_path();
  struct statvfs st;
  if (probe.empty() || statvfs(probe.c_str(), &st) != 0) return std::nullopt;
  const uint64_t unit = st.f_frsize ? st.f_frsize : st.f_bsize;
  const uint64_t free_bytes = uint64_t(geteuid() == 0 ? st.f_bfree : st.f_bavail) * unit;
  const uint64_t size = uint64_t(st.f_blocks) * unit;
  const uint64_t threshold = std::max<uint64_t>(64 << 10, std::min<uint64_t>(16 << 20, size / 1000));
  if (free_bytes >= threshold) return std::nullopt;
  return fmt::format("no space left on device: {} KiB free on the file system of {}", free_bytes >> 10, path);
}

}  // namespace slimpi
