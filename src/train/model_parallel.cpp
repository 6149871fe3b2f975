#include "train/model_parallel.h"

#include <slimpi/error.h>

#include "parallel/device.h"
#include "parallel/mpi_bytes.h"
#include "train/expert_parallel.h"

namespace slimpi {

ModelParallel::ModelParallel(MPI_Comm trainer, int tensor_parallel, int expert_parallel, const DeviceChoice& device,
                             bool sequence_parallel, int kv_head_replicas, int context_parallel, int pipeline_parallel)
    : tensor_size_(tensor_parallel),
      expert_size_(expert_parallel),
      context_size_(context_parallel),
      pipeline_size_(pipeline_parallel),
      sequence_parallel_(sequence_parallel) {
  SLIMPI_CHECK(!sequence_parallel || tensor_parallel > 1,
               "sequence parallelism splits the tokens over the tensor-parallel group: it needs tensor parallelism");
  int rank = 0, n = 1;
  MPI_Comm_rank(trainer, &rank);
  MPI_Comm_size(trainer, &n);
  const int t = tensor_parallel, c = context_parallel, p = pipeline_parallel;
  SLIMPI_CHECK(t >= 1 && c >= 1 && p >= 1 && n % (t * c * p) == 0,
               "tensor parallelism {} x context parallelism {} x pipeline parallelism {} over {} trainer ranks: the "
               "product must divide the trainer ranks", t, c, p, n);
  SLIMPI_CHECK(expert_parallel >= 1 && (n / (t * p)) % expert_parallel == 0,
               "expert parallelism over {} of the {} data- and context-parallel ranks of a stage ({} trainer ranks / "
               "tensor parallel {} / pipeline parallel {}): the group size must divide them", expert_parallel,
               n / (t * p), n, t, p);
  tensor_rank_ = rank % t;
  context_rank_ = (rank / t) % c;
  stage_ = (rank / (t * c)) % p;
  const int data_index = rank / (t * c * p);
  check_mpi(MPI_Comm_split(trainer, rank / t, rank, &tensor_mpi_), "MPI_Comm_split(tensor group)");
  check_mpi(MPI_Comm_split(trainer, (rank / (t * c)) * t + tensor_rank_, rank, &context_mpi_),
            "MPI_Comm_split(context group)");
  check_mpi(MPI_Comm_split(trainer, tensor_rank_ + t * (context_rank_ + c * data_index), stage_, &pipeline_mpi_),
            "MPI_Comm_split(pipeline group)");
  check_mpi(MPI_Comm_split(trainer, rank % (t * c * p), rank, &data_mpi_), "MPI_Comm_split(data-parallel group)");
  check_mpi(MPI_Comm_split(trainer, tensor_rank_ + t * stage_, rank, &replicas_mpi_), "MPI_Comm_split(replicas)");
  tensor_ = make_comm(tensor_mpi_, "tensor_parallel", device);
  context_ = make_comm(context_mpi_, "context_parallel", device);
  // (host memory: the stages' activations pass point to point over MPI, train/pipeline_links.h)
  pipeline_ = make_comm(pipeline_mpi_, "pipeline_parallel", DeviceChoice{});
  data_ = make_comm(data_mpi_, "data_parallel", device);
  replicas_ = make_comm(replicas_mpi_, "replicas", device);
  if (p > 1) {
    const bool end_stage = stage_ == 0 || stage_ == p - 1;
    check_mpi(MPI_Comm_split(pipeline_mpi_, end_stage ? 0 : MPI_UNDEFINED, stage_, &tied_mpi_),
              "MPI_Comm_split(tied embedding stages)");
    if (end_stage) tied_ = make_comm(tied_mpi_, "tied_embedding", device);
  }
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
  pipeline_.reset();
  tied_.reset();
  for (MPI_Comm* c : {&context_mpi_, &replicas_mpi_, &pipeline_mpi_, &tied_mpi_})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  if (kv_replicas_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&kv_replicas_mpi_);
  if (tensor_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&tensor_mpi_);
  if (data_mpi_ != MPI_COMM_NULL) MPI_Comm_free(&data_mpi_);
}

PipelineShard ModelParallel::pipeline_shard(const std::vector<int64_t>& layers_per_stage) const {
  const PipelineShard place{stage_, pipeline_size_, pipeline_size_ > 1 ? pipeline_.get() : nullptr, tied_.get(), 0, 0};
  return place.for_layers(layers_per_stage);
}

ExpertShard ModelParallel::expert_shard() const { return experts_ ? experts_->shard() : ExpertShard{}; }

Comm* ModelParallel::expert_replicas() const { return experts_ ? &experts_->replicas() : nullptr; }

}  // namespace slimpi
