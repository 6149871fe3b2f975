// What CUDA this process has: compiled in or not, the runtime and driver versions, and
// the GPUs it sees. Safe on machines without a GPU or driver (answers "none"), so
// `slimpi --version` and device selection (parallel/device.h) can ask anywhere.
#pragma once

#include <string>
#include <vector>

namespace slimpi {

struct GpuInfo {
  int index = 0;
  std::string name;
  double memory_gib = 0;
  int compute_major = 0, compute_minor = 0;
};

bool cuda_compiled();
// GPUs visible to this process (CUDA_VISIBLE_DEVICES applies); empty without a driver.
std::vector<GpuInfo> visible_gpus();
// "runtime 13.2, driver 13.0" / "runtime 13.2, no driver" / "not compiled".
std::string cuda_description();
// "2 x NVIDIA H200 (139.8 GiB, sm_90)" / "none".
std::string gpus_description();

}  // namespace slimpi
