// A scratch directory every rank of MPI_COMM_WORLD agrees on (made by rank 0, removed
// at the end of the test by rank 0 after a barrier).
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace slimpi::testing {

class SharedTmpDir {
 public:
  SharedTmpDir() {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char buf[256] = {0};
    if (rank == 0) {
      std::string p = (std::filesystem::temp_directory_path() / ("slimpi_test_" + std::to_string(::getpid())))
                          .string() + "_" + std::to_string(counter_++);
      std::filesystem::create_directories(p);
      p.copy(buf, sizeof(buf) - 1);
    }
    MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = buf;
  }
  ~SharedTmpDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::filesystem::remove_all(path_);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
  static inline int counter_ = 0;
};

}  // namespace slimpi::testing
