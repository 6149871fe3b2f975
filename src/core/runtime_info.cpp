#include "core/runtime_info.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <fmt/ranges.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/log.h"

namespace slimpi {

int64_t resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

std::vector<std::string> loaded_openmp_runtimes() {
  std::vector<std::string> found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        std::string name = info->dlpi_name ? info->dlpi_name : "";
        const std::string base = name.substr(name.rfind('/') + 1);
        for (const char* runtime : {"libgomp", "libiomp", "libomp."})
          if (base.rfind(runtime, 0) == 0) {
            std::error_code ec;
            auto real = std::filesystem::canonical(name, ec);
            auto* out = static_cast<std::vector<std::string>*>(data);
            const std::string path = ec ? name : real.string();
            if (std::find(out->begin(), out->end(), path) == out->end()) out->push_back(path);
          }
        return 0;
      },
      &found);
  return found;
}

namespace {
std::string torch_blas() {
  const std::string config = at::show_config();
  if (config.find("Math Kernel Library") != std::string::npos) return "MKL (inside LibTorch)";
  if (config.find("OpenBLAS") != std::string::npos) return "OpenBLAS";
  return "unknown (see torch's show_config)";
}
}  // namespace

RuntimeSettings apply_runtime_settings(MPI_Comm world, int64_t threads) {
  RuntimeSettings rt;
  MPI_Comm node;
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &rt.local_rank);
  MPI_Comm_size(node, &rt.local_ranks);
  MPI_Comm_free(&node);
  rt.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  rt.threads = threads > 0 ? static_cast<int>(threads) : std::max(1, rt.cores / rt.local_ranks);
  at::set_num_threads(rt.threads);
  rt.blas = torch_blas();
  rt.openmp_runtimes = loaded_openmp_runtimes();
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  rt.omp_wait_policy = wait ? wait : "(unset: spin-waiting)";

  if (rank == 0) {
    if (rt.openmp_runtimes.size() > 1)
      log::warn("{} OpenMP runtimes are loaded ({}): their thread pools compete for the cores. Link "
                "nothing that brings its own OpenMP beside LibTorch's",
                rt.openmp_runtimes.size(), fmt::join(rt.openmp_runtimes, ", "));
    if (rt.threads * rt.local_ranks > rt.cores)
      log::warn("{} ranks x {} threads on a node with {} cores: oversubscribed, expect slow steps",
                rt.local_ranks, rt.threads, rt.cores);
  }
  return rt;
}

std::string RuntimeSettings::describe() const {
  return fmt::format("runtime: {} torch thread(s) per rank, {} rank(s) on this node, {} core(s); BLAS {}; "
                     "OpenMP {}; OMP_WAIT_POLICY {}",
                     threads, local_ranks, cores, blas,
                     openmp_runtimes.empty() ? "(none loaded)" : fmt::format("{}", fmt::join(openmp_runtimes, ", ")),
                     omp_wait_policy);
}

}  // namespace slimpi
