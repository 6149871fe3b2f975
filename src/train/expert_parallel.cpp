#include "train/expert_parallel.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>

#include <map>
#include <string>

#include "parallel/comm_tensor.h"
#include "parallel/device.h"
#include "parallel/mpi_bytes.h"

namespace slimpi {

ExpertGroups::ExpertGroups(MPI_Comm trainer, int size, const DeviceChoice& device) {
  int rank = 0, n = 1;
  MPI_Comm_rank(trainer, &rank);
  MPI_Comm_size(trainer, &n);
  SLIMPI_CHECK(size >= 1 && n % size == 0, "expert parallelism over {} of {} trainer ranks: the group size must "
               "divide the trainer ranks", size, n);
  group_index_ = rank / size;
  check_mpi(MPI_Comm_split(trainer, group_index_, rank, &group_mpi_), "MPI_Comm_split(expert group)");
  check_mpi(MPI_Comm_split(trainer, rank % size, rank, &replicas_mpi_), "MPI_Comm_split(expert replicas)");
  group_ = make_comm(group_mpi_, "expert_group", device);
  replicas_ = make_comm(replicas_mpi_, "expert_replicas", device);
}

ExpertGroups::~ExpertGroups() {
  group_.reset();
  replicas_.reset();
  if (group_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&group_mpi_);
  if (replicas_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&replicas_mpi_);
}

std::string shift_expert_index(const std::string& name, int64_t shift) {
  static const std::string marker = ".mlp.experts.";
  const size_t at = name.find(marker);
  if (at == std::string::npos) return name;
  const size_t begin = at + marker.size(), end = name.find('.', begin);
  SLIMPI_CHECK(end != std::string::npos, "parameter name {} has no expert index", name);
  const int64_t e = std::stoll(name.substr(begin, end - begin));
  return name.substr(0, begin) + std::to_string(e + shift) + name.substr(end);
}

std::vector<NamedTensor> gather_expert_tensors(const ExpertShard& shard, int64_t n_local,
                                               const std::vector<NamedTensor>& local, bool to_all) {
  if (shard.size == 1) return local;
  SLIMPI_CHECK(shard.comm, "gather_expert_tensors: a shard without its group");
  std::vector<at::Tensor> flat;  // every local tensor flattened, back to back
  for (const auto& t : local) {
    SLIMPI_CHECK(t.tensor.scalar_type() == local.front().tensor.scalar_type(),
                 "gather_expert_tensors: {} is not of the first tensor's dtype", t.name);
    flat.push_back(t.tensor.detach().reshape({-1}));
  }
  const at::Tensor mine = flat.empty() ? at::empty({0}) : at::cat(flat);
  const at::Tensor all = to_all ? allgather(*shard.comm, mine) : gather_to_first(*shard.comm, mine);  // [G, n]
  if (!all.defined()) return local;
  std::vector<NamedTensor> out;
  for (int g = 0; g < shard.size; ++g) {
    int64_t offset = 0;
    for (const auto& t : local) {
      const int64_t n = t.tensor.numel();
      out.push_back({shift_expert_index(t.name, int64_t(g - shard.rank) * n_local),
                     all[g].narrow(0, offset, n).view(t.tensor.sizes())});
      offset += n;
    }
  }
  return out;
}

}  // namespace slimpi
