// rollouts.h5-style CSR appends (collective, parallel HDF5) against a plain POSIX
// pwrite of the same bytes at the same offsets into one shared file, in the same run,
// alternating per iteration. Files go to $TMPDIR (default /tmp). Two columns:
//   BM_CsrAppendVsPosix      token ids (int32), rows of 16..1024 tokens
//   BM_RoutingAppendVsPosix  MoE routing traces (int16), rows of (tokens − 1) x 48 MoE
//                            layers x top-8 expert ids (Qwen3-30B-A3B's shape: 768 B/token)
//   mpirun -np 2 build/perf/bench_h5
// Counters: h5_ms, posix_ms (slowest rank), h5_vs_posix (posix time / h5 time).
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

#include "io/appendable_dataset.h"
#include "mpi_bench_main.h"

namespace slimpi::perf {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// One rank's rows: one row per sample of 16..1024 tokens, `per_token` values each
// (1: token ids; MoE layers x top-k: routing traces), `mb` MB in all.
template <class T>
struct Rows {
  std::vector<T> values;
  std::vector<int64_t> lengths;
};
template <class T>
Rows<T> make_rows(int64_t mb, int64_t per_token) {
  Rows<T> r;
  const int64_t target = mb * (1 << 20) / int64_t(sizeof(T));
  for (int64_t i = 0; int64_t(r.values.size()) < target; ++i) {
    int64_t len = std::min<int64_t>((16 + (i * 37) % 1009) * per_token, target - int64_t(r.values.size()));
    r.lengths.push_back(len);
    r.values.insert(r.values.end(), len, T(i % 128));
  }
  return r;
}

template <class T>
void write_h5(const std::string& path, const Rows<T>& rows) {
  h5::File f = h5::File::create(path, MPI_COMM_WORLD);
  auto csr = h5::CsrDataset<T>::create(f, f.id(), "values", 1 << 20);
  csr.append(rows.values.data(), rows.lengths.data(), rows.lengths.size());
  f.close();
}

// The same bytes (values, then row lengths) at this rank's offset of one shared file.
template <class T>
void write_posix(const std::string& path, const Rows<T>& rows) {
  constexpr uint64_t size = sizeof(T);
  uint64_t mine = rows.values.size() * size + rows.lengths.size() * 8, before = 0;
  MPI_Exscan(&mine, &before, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  if (world_rank() == 0) {
    before = 0;
    ::close(::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  int fd = ::open(path.c_str(), O_WRONLY);
  bool ok = fd >= 0 && ::pwrite(fd, rows.values.data(), rows.values.size() * size, before) >= 0 &&
            ::pwrite(fd, rows.lengths.data(), rows.lengths.size() * 8, before + rows.values.size() * size) >= 0;
  if (fd >= 0) ::close(fd);
  if (!ok) MPI_Abort(MPI_COMM_WORLD, 1);
}

template <class T>
void append_vs_posix(benchmark::State& state, int64_t per_token) {
  const int64_t mb = state.range(0);
  Rows<T> rows = make_rows<T>(mb, per_token);
  const std::string dir = std::filesystem::temp_directory_path().string();
  const std::string h5_path = dir + "/slimpi_bench_csr.h5", posix_path = dir + "/slimpi_bench_posix.bin";
  double h5_s = 0, posix_s = 0;
  int64_t i = 0;
  for (auto _ : state) {
    double a, b;
    if (i++ % 2 == 0) {
      a = timed_max([&] { write_h5(h5_path, rows); });
      b = timed_max([&] { write_posix(posix_path, rows); });
    } else {
      b = timed_max([&] { write_posix(posix_path, rows); });
      a = timed_max([&] { write_h5(h5_path, rows); });
    }
    state.SetIterationTime(a);
    h5_s += a;
    posix_s += b;
  }
  const double n = double(state.iterations());
  state.SetBytesProcessed(state.iterations() * mb * (1 << 20));
  state.counters["h5_ms"] = 1e3 * h5_s / n;
  state.counters["posix_ms"] = 1e3 * posix_s / n;
  state.counters["h5_vs_posix"] = posix_s / h5_s;
  if (world_rank() == 0) {
    std::filesystem::remove(h5_path);
    std::filesystem::remove(posix_path);
  }
}

void BM_CsrAppendVsPosix(benchmark::State& state) { append_vs_posix<int32_t>(state, 1); }
void BM_RoutingAppendVsPosix(benchmark::State& state) { append_vs_posix<int16_t>(state, 48 * 8); }

BENCHMARK(BM_RoutingAppendVsPosix)->Arg(32)->Arg(128)->Iterations(6)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CsrAppendVsPosix)->Arg(4)->Arg(32)->Arg(128)->Iterations(6)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace slimpi::perf

int main(int argc, char** argv) { return slimpi::perf::run_mpi_benchmarks(argc, argv); }
