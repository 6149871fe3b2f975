#include "parallel/mpi_bytes.h"

#include <slimpi/error.h>

#include <cstdint>

namespace slimpi {

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  SLIMPI_FAIL("{} failed: {}", what, std::string(text, len));
}

void broadcast_string(MPI_Comm comm, std::string& text, int root) {
  uint64_t n = text.size();
  check_mpi(MPI_Bcast(&n, 1, MPI_UINT64_T, root, comm), "MPI_Bcast(length)");
  text.resize(n);
  // Large strings in chunks: MPI counts are int.
  const uint64_t chunk = uint64_t(1) << 30;
  for (uint64_t off = 0; off < n; off += chunk)
    check_mpi(MPI_Bcast(text.data() + off, static_cast<int>(std::min(chunk, n - off)), MPI_CHAR,
                        root, comm),
              "MPI_Bcast(bytes)");
}

}  // namespace slimpi
