#include "train/model_parallel.h"

#include <slimpi/error.h>

#include "parallel/device.h"
#include "parallel/mpi_bytes.h"
#include "train/expert_parallel.h"

namespace slimpi {

ModelParallel::ModelParallel(MPI_Comm trainer, int tensor_parallel, int expert_parallel, const DeviceChoice& device,
                             bool sequence_parallel, int kv_head_replicas)
    : tensor_size_(tensor_parallel), expert_size_(expert_parallel), sequence_parallel_(sequence_parallel) {
  SLIMPI_CHECK(!sequence_parallel || tensor_parallel > 1,
               "sequence parallelism splits the tokens over the tensor-parallel group: it needs tensor parallelism");
  int rank = 0, n = 1;
  MPI_Comm_rank(trainer, &rank);
  MPI_Comm_size(trainer, &n);
  SLIMPI_CHECK(tensor_parallel >= 1 && n % tensor_parallel == 0,
               "tensor parallelism over {} of {} trainer ranks: the group size must divide the trainer ranks",
               tensor_parallel, n);
  SLIMPI_CHECK(expert_parallel >= 1 && (n / tensor_parallel) % expert_parallel == 0,
               "expert parallelism over {} of the {} data-parallel ranks ({} trainer ranks / tensor parallel {}): the "
               "group size must divide them", expert_parallel, n / tensor_parallel, n, tensor_parallel);
  tensor_rank_ = rank % tensor_parallel;
  check_mpi(MPI_Comm_split(trainer, rank / tensor_parallel, rank, &tensor_mpi_), "MPI_Comm_split(tensor group)");
  check_mpi(MPI_Comm_split(trainer, tensor_rank_, rank, &data_mpi_), "MPI_Comm_split(data-parallel group)");
  tensor_ = make_comm(tensor_mpi_, "tensor_parallel", device);
  data_ = make_comm(data_mpi_, "data_parallel", device);
  if (expert_parallel > 1) experts_ = std::make_unique<ExpertGroups>(data_mpi_, expert_parallel, device);
  SLIMPI_CHECK(kv_head_replicas >= 1 && tensor_parallel % kv_head_replicas == 0,
               "key/value heads replicated over {} ranks of a tensor group of {}", kv_head_replicas, tensor_parallel);
  if (kv_head_replicas > 1) {
    check_mpi(MPI_Comm_split(tensor_mpi_, tensor_rank_ / kv_head_replicas, rank, &kv_replicas_mpi_),
              "MPI_Comm_split(key/value head replicas)");
    kv_replicas_ = make_comm(kv_replicas_mpi_, "kv_head_replicas", device);
  }
}

ModelParallel::~ModelParallel() {
  experts_.reset();
  tensor_.reset();
  data_.reset();
  kv_replicas_.reset();
  if (kv_replicas_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&kv_replicas_mpi_);
  if (tensor_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&tensor_mpi_);
  if (data_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&data_mpi_);
}

ExpertShard ModelParallel::expert_shard() const { return experts_ ? experts_->shard() : ExpertShard{}; }

Comm* ModelParallel::expert_replicas() const { return experts_ ? &experts_->replicas() : nullptr; }

}  // namespace slimpi
