// main() for GoogleTest programs run under mpirun: MPI is initialised around the
// tests, only rank 0 prints the usual report, and a failure on any rank makes every rank exit non-zero (so mpirun and
// ctest see it whichever rank failed).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

namespace {

// Ranks other than 0 report failures only, tagged with their rank.
struct FailurePrinter : ::testing::EmptyTestEventListener {
  int rank;
  explicit FailurePrinter(int r) : rank(r) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }
};

int run_tests(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any_failed;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int any_failed = 0;
  any_failed = run_tests(argc, argv);
  MPI_Finalize();
  return any_failed;
}
