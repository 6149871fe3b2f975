#include "core/runtime_info.h"

#include <ATen/Parallel.h>
#include <link.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "core/log.h"

namespace slimpi {

std::string loaded_blas_library() {
  std::string found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        std::string name = info->dlpi_name ? info->dlpi_name : "";
        auto base = name.substr(name.rfind('/') + 1);
        if (base.rfind("libblas.so", 0) == 0 || base.rfind("libopenblas", 0) == 0) {
          *static_cast<std::string*>(data) = name;
          return 1;
        }
        return 0;
      },
      &found);
  if (found.empty()) return found;
  std::error_code ec;
  auto real = std::filesystem::canonical(found, ec);
  return ec ? found : real.string();
}

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
  rt.blas = loaded_blas_library();
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  rt.omp_wait_policy = wait ? wait : "(unset: spin-waiting)";

  if (rank == 0) {
    if (rt.blas.find("openblas") == std::string::npos)
      log::warn("the loaded BLAS is '{}', not OpenBLAS: CPU matmuls run ~30x slower. Run "
                "scripts/install_deps.sh (it points the libblas/liblapack alternatives at OpenBLAS)",
                rt.blas.empty() ? "none" : rt.blas);
    if (rt.threads * rt.local_ranks > rt.cores)
      log::warn("{} ranks x {} threads on a node with {} cores: oversubscribed, expect slow steps",
                rt.local_ranks, rt.threads, rt.cores);
  }
  return rt;
}

std::string RuntimeSettings::describe() const {
  return fmt::format("runtime: {} torch thread(s) per rank, {} rank(s) on this node, {} core(s); BLAS {}; "
                     "OMP_WAIT_POLICY {}",
                     threads, local_ranks, cores, blas.empty() ? "(none loaded)" : blas, omp_wait_policy);
}

}  // namespace slimpi
