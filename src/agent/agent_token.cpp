#include "agent/agent_token.h"

#include <fcntl.h>
#include <slimpi/error.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace slimpi {

std::string agent_token_path(const std::string& run_dir) { return run_dir + "/agent_token"; }

namespace {
std::string& job_token() {
  static std::string token;
  return token;
}
}  // namespace

void set_job_agent_token(const std::string& token) { job_token() = token; }

std::string job_agent_token(const std::string& run_dir) {
  return job_token().empty() ? read_agent_token(run_dir) : job_token();
}

std::string write_agent_token(const std::string& run_dir, std::string* written) {
  unsigned char bytes[32];
  std::ifstream random("/dev/urandom", std::ios::binary);
  if (!random.read(reinterpret_cast<char*>(bytes), sizeof(bytes))) return "cannot read /dev/urandom";
  std::string token;
  for (unsigned char b : bytes) token += fmt::format("{:02x}", b);
  const std::string path = agent_token_path(run_dir);
  unlink(path.c_str());  // a new file, so that its mode is ours whoever made the last one
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return fmt::format("cannot create {}: {}", path, std::strerror(errno));
  const std::string text = token + "\n";
  const bool ok = fchmod(fd, 0600) == 0 && write(fd, text.data(), text.size()) == ssize_t(text.size());
  const int e = errno;
  close(fd);
  if (!ok) {
    unlink(path.c_str());
    return fmt::format("cannot write {}: {}", path, std::strerror(e));
  }
  if (written) *written = token;
  return "";
}

std::string read_agent_token(const std::string& run_dir) {
  const std::string path = agent_token_path(run_dir);
  std::ifstream in(path);
  std::string token;
  if (!(in >> token) || token.size() != 64)
    SLIMPI_FAIL("the agent endpoint's token {} is missing or malformed (slimpi run writes it at the job's start)", path);
  return token;
}

}  // namespace slimpi
