#include "train/model_parallel.h"

#include <slimpi/error.h>

#include "parallel/device.h"
#include "parallel/mpi_bytes.h"
#include "train/expert_parallel.h"

namespace slimpi {

ModelParallel::ModelParallel(MPI_Comm trainer, int tensor_parallel, int expert_parallel, const DeviceChoice& device,
                             bool sequence_parallel, int kv_head_replicas, int context_parallel)
    : tensor_size_(tensor_parallel),
      expert_size_(expert_parallel),
      context_size_(context_parallel),
      sequence_parallel_(sequence_parallel) {
  SLIMPI_CHECK(!sequence_parallel || tensor_parallel > 1,
               "sequence parallelism splits the tokens over the tensor-parallel group: it needs tensor parallelism");
  int rank = 0, n = 1;
  MPI_Comm_rank(trainer, &rank);
  MPI_Comm_size(trainer, &n);
  SLIMPI_CHECK(tensor_parallel >= 1 && context_parallel >= 1 && n % (tensor_parallel * context_parallel) == 0,
               "tensor parallelism {} x context parallelism {} over {} trainer ranks: the product must divide the "
               "trainer ranks", tensor_parallel, context_parallel, n);
  const int block = tensor_parallel * context_parallel;
  SLIMPI_CHECK(expert_parallel >= 1 && (n / tensor_parallel) % expert_parallel == 0,
               "expert parallelism over {} of the {} data- and context-parallel ranks ({} trainer ranks / tensor "
               "parallel {}): the group size must divide them", expert_parallel, n / tensor_parallel, n,
               tensor_parallel);
  tensor_rank_ = rank % tensor_parallel;
  context_rank_ = (rank / tensor_parallel) % context_parallel;
  const int data_index = rank / block;
  check_mpi(MPI_Comm_split(trainer, rank / tensor_parallel, rank, &tensor_mpi_), "MPI_Comm_split(tensor group)");
  check_mpi(MPI_Comm_split(trainer, data_index * tensor_parallel + tensor_rank_, rank, &context_mpi_),
            "MPI_Comm_split(context group)");
  check_mpi(MPI_Comm_split(trainer, rank % block, rank, &data_mpi_), "MPI_Comm_split(data-parallel group)");
  check_mpi(MPI_Comm_split(trainer, tensor_rank_, rank, &replicas_mpi_), "MPI_Comm_split(replicas)");
  tensor_ = make_comm(tensor_mpi_, "tensor_parallel", device);
  context_ = make_comm(context_mpi_, "context_parallel", device);
  data_ = make_comm(data_mpi_, "data_parallel", device);
  replicas_ = make_comm(replicas_mpi_, "replicas", device);
  if (expert_parallel > 1) experts_ = std::make_unique<ExpertGroups>(replicas_mpi_, expert_parallel, device);
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
  context_.reset();
  replicas_.reset();
  for (MPI_Comm* c : {&context_mpi_, &replicas_mpi_})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  if (kv_replicas_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&kv_replicas_mpi_);
  if (tensor_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&tensor_mpi_);
  if (data_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&data_mpi_);
}

ExpertShard ModelParallel::expert_shard() const { return experts_ ? experts_->shard() : ExpertShard{}; }

Comm* ModelParallel::expert_replicas() const { return experts_ ? &experts_->replicas() : nullptr; }

}  // namespace slimpi
