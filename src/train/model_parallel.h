// ModelParallel — the trainer's model-parallel layout over its N ranks
// (parallel.tensor_parallel = t, parallel.expert_parallel = G), in Megatron's order:
// tensor fastest, then expert, then data.
//   trainer rank r        tensor rank r % t, data-parallel index r / t (of D = N / t)
//   tensor group          the t consecutive ranks of one data-parallel index: the same
//                         samples, each holding one shard of the dense layers
//                         (model/tensor_shard.h); every forward is collective over it
//   data-parallel group   the D ranks of one tensor rank: they hold the same shard and
//                         sum its gradients, whiten advantages, count samples and
//                         reduce metrics among themselves
//   expert groups         ExpertGroups (train/expert_parallel.h) over the data-parallel
//                         group: G consecutive data-parallel indices hold every expert
//   key/value replicas    t > Hkv: the t / Hkv consecutive ranks of a tensor group that
//                         hold the same key/value heads (they sum those heads' gradients)
// Pipeline and context parallelism would be further factors between tensor and data.
// Owned by the driver on trainer ranks; lives as long as the models that point at it.
#pragma once

#include <mpi.h>

#include <memory>

#include "model/moe.h"
#include "model/tensor_shard.h"
#include "parallel/comm.h"

namespace slimpi {

struct DeviceChoice;
class ExpertGroups;

class ModelParallel {
 public:
  // Collective over `trainer`. t and G must divide its size and each other's quotient.
  // sequence_parallel: the shards' TensorShard::sequence_parallel (needs t > 1).
  // kv_head_replicas: the model's kv_head_replicas(cfg, t) (model/tensor_shard.h).
  ModelParallel(MPI_Comm trainer, int tensor_parallel, int expert_parallel, const DeviceChoice& device,
                bool sequence_parallel = false, int kv_head_replicas = 1);
  ~ModelParallel();
  ModelParallel(const ModelParallel&) = delete;
  ModelParallel& operator=(const ModelParallel&) = delete;

  int tensor_size() const { return tensor_size_; }
  int tensor_rank() const { return tensor_rank_; }
  int data_size() const { return data_->size(); }
  int data_index() const { return data_->rank(); }
  int expert_size() const { return expert_size_; }

  TensorShard tensor_shard() const {
    return {tensor_rank_, tensor_size_, tensor_size_ > 1 ? tensor_.get() : nullptr, sequence_parallel_,
            kv_replicas_.get()};
  }
  ExpertShard expert_shard() const;
  Comm& data() const { return *data_; }
  // The ranks holding this rank's experts (null without expert parallelism).
  Comm* expert_replicas() const;
  const ExpertGroups* experts() const { return experts_.get(); }

  // Whether this rank takes part in gathering the whole model onto trainer rank 0
  // (gather_whole_model with to_all = false: a checkpoint, a split weight sync): the
  // tensor groups of the first G data-parallel indices.
  bool joins_gather_to_first() const { return data_index() < expert_size_; }

 private:
  int tensor_size_ = 1, tensor_rank_ = 0, expert_size_ = 1;
  bool sequence_parallel_ = false;
  MPI_Comm tensor_mpi_ = MPI_COMM_NULL, data_mpi_ = MPI_COMM_NULL, kv_replicas_mpi_ = MPI_COMM_NULL;
  std::unique_ptr<Comm> tensor_, data_, kv_replicas_;  // kv_replicas_: null unless t > Hkv
  std::unique_ptr<ExpertGroups> experts_;
};

}  // namespace slimpi
