#include "io/h5_meta.h"

#include <slimpi/version.h>

#include <ctime>

#include "parallel/watchdog.h"

namespace slimpi::h5 {

void write_file_meta(const File& file, const std::string& kind, const std::string& deck_text) {
  // Every rank writes identical values (attribute writes are collective).
  char created[32] = {0};
  std::time_t now = std::time(nullptr);
  if (file.parallel()) {
    static const std::string context = "[HDF5 file] creation time from rank 0";
    WaitGuard guard({&context, "MPI_Bcast", sizeof(now), "u8", 0});
    MPI_Bcast(&now, sizeof(now), MPI_BYTE, 0, file.comm());
  }
  std::strftime(created, sizeof(created), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  write_attr(file.id(), "kind", kind);
  write_attr(file.id(), "slimpi_version", version());
  write_attr(file.id(), "created_utc", std::string(created));
  write_attr(file.id(), "deck", deck_text);
}

}  // namespace slimpi::h5
