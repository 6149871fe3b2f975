#include "core/gpu_info.h"

#include <slimpi/build_info.h>

#include <fmt/format.h>
#if SLIMPI_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace slimpi {

bool cuda_compiled() { return SLIMPI_HAVE_CUDA; }

std::vector<GpuInfo> visible_gpus() {
  std::vector<GpuInfo> gpus;
#if SLIMPI_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the "no driver" error
    return gpus;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    gpus.push_back({i, prop.name, double(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), prop.major, prop.minor});
  }
#endif
  return gpus;
}

std::string cuda_description() {
#if SLIMPI_HAVE_CUDA
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);  // 0 when no driver is installed
  const auto version = [](int v) { return fmt::format("{}.{}", v / 1000, v % 1000 / 10); };
  return fmt::format("compiled in (runtime {}, {})", version(runtime),
                     driver ? "driver " + version(driver) : std::string("no driver on this machine"));
#else
  return "not compiled";
#endif
}

std::string gpus_description() {
  const auto gpus = visible_gpus();
  if (gpus.empty()) return "none";
  std::string out = fmt::format("{}:", gpus.size());
  for (const auto& g : gpus)
    out += fmt::format(" [{}] {} ({:.1f} GiB, sm_{}{})", g.index, g.name, g.memory_gib, g.compute_major,
                       g.compute_minor);
  return out;
}

}  // namespace slimpi
