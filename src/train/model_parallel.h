// ModelParallel — the trainer's model-parallel layout over its N ranks
// (parallel.tensor_parallel = t, parallel.context_parallel = c, parallel.pipeline_parallel
// = p, parallel.expert_parallel = G), in Megatron's order: tensor fastest, then context,
// then pipeline, then data (experts within the data × context ranks of a stage).
//   trainer rank r        r = tensor + t·(context + c·(stage + p·data)): tensor rank r % t,
//                         context rank (r / t) % c, stage (r / tc) % p, data-parallel
//                         index r / (tcp) (of D = N / (t·c·p))
//   tensor group          the t consecutive ranks of one (context, stage, data): the same
//                         tokens, each holding one shard of the dense layers
//                         (model/tensor_shard.h); every forward is collective over it
//   context group         the c ranks of one (tensor, stage, data), t apart: the same
//                         samples, each running its chunks of every sequence
//                         (model/context_split.h); packed forwards are collective over it
//   pipeline group        the p ranks of one (tensor, context, data), tc apart: one stage
//                         each (model/pipeline_shard.h); activations and their gradients
//                         pass between neighbours (train/trainer_pipeline.cpp)
//   data-parallel group   the D ranks of one (tensor, context, stage): distinct samples;
//                         they count samples, whiten advantages and reduce metrics
//   replicas              the D·c ranks of one (tensor rank, stage) (data × context): they
//                         hold the same shard and sum its gradients; the distributed
//                         optimizer shards over them (the data-parallel group at c = 1)
//   expert groups         ExpertGroups (train/expert_parallel.h) over the replicas: G
//                         consecutive replica indices hold every expert
//   key/value replicas    t > Hkv: the t / Hkv consecutive ranks of a tensor group that
//                         hold the same key/value heads (they sum those heads' gradients)
// A block of t·c·p consecutive ranks trains one data-parallel share of the samples
// (buffer/sample_transport.h).
// Owned by the driver on trainer ranks; lives as long as the models that point at it.
#pragma once

#include <mpi.h>

#include <memory>

#include "model/context_split.h"
#include "model/moe.h"
#include "model/pipeline_shard.h"
#include "model/tensor_shard.h"
#include "parallel/comm.h"

namespace slimpi {

struct DeviceChoice;
class ExpertGroups;

class ModelParallel {
 public:
  // Collective over `trainer`. t·c·p must divide its size, and G the quotient N / (t·p).
  // sequence_parallel: the shards' TensorShard::sequence_parallel (needs t > 1).
  // kv_head_replicas: the model's kv_head_replicas(cfg, t) (model/tensor_shard.h).
  ModelParallel(MPI_Comm trainer, int tensor_parallel, int expert_parallel, const DeviceChoice& device,
                bool sequence_parallel = false, int kv_head_replicas = 1, int context_parallel = 1,
                int pipeline_parallel = 1);
  ~ModelParallel();
  ModelParallel(const ModelParallel&) = delete;
  ModelParallel& operator=(const ModelParallel&) = delete;

  int tensor_size() const { return tensor_size_; }
  int tensor_rank() const { return tensor_rank_; }
  int data_size() const { return data_->size(); }
  int data_index() const { return data_->rank(); }
  int expert_size() const { return expert_size_; }
  int context_size() const { return context_size_; }
  int context_rank() const { return context_rank_; }
  int pipeline_size() const { return pipeline_size_; }
  int stage() const { return stage_; }
  // Whether this rank is the first of its tensor × context × pipeline block (it records
  // the block's samples).
  bool first_of_block() const { return tensor_rank_ == 0 && context_rank_ == 0 && stage_ == 0; }
  // How many consecutive trainer ranks train the same samples (t·c·p).
  int block_size() const { return tensor_size_ * context_size_ * pipeline_size_; }
  // This rank's stage of a model whose stages hold `layers_per_stage` layers each
  // (stage_layer_counts, model/pipeline_shard.h).
  PipelineShard pipeline_shard(const std::vector<int64_t>& layers_per_stage) const;

  TensorShard tensor_shard() const {
    return {tensor_rank_, tensor_size_, tensor_size_ > 1 ? tensor_.get() : nullptr, sequence_parallel_,
            kv_replicas_.get()};
  }
  ExpertShard expert_shard() const;
  ContextShard context_shard() const {
    return {context_rank_, context_size_, context_size_ > 1 ? context_.get() : nullptr};
  }
  Comm& data() const { return *data_; }
  Comm& replicas() const { return *replicas_; }
  // The ranks holding this rank's experts (null without expert parallelism).
  Comm* expert_replicas() const;
  const ExpertGroups* experts() const { return experts_.get(); }

  // Whether this rank takes part in gathering the whole model onto trainer rank 0
  // (gather_whole_model with to_all = false: a split weight sync): the tensor groups of
  // the first G replica indices of every stage.
  bool joins_gather_to_first() const { return replicas_->rank() < expert_size_; }

 private:
  int tensor_size_ = 1, tensor_rank_ = 0, expert_size_ = 1, context_size_ = 1, context_rank_ = 0;
  int pipeline_size_ = 1, stage_ = 0;
  bool sequence_parallel_ = false;
  MPI_Comm tensor_mpi_ = MPI_COMM_NULL, data_mpi_ = MPI_COMM_NULL, kv_replicas_mpi_ = MPI_COMM_NULL;
  MPI_Comm context_mpi_ = MPI_COMM_NULL, replicas_mpi_ = MPI_COMM_NULL;
  MPI_Comm pipeline_mpi_ = MPI_COMM_NULL, tied_mpi_ = MPI_COMM_NULL;
  std::unique_ptr<Comm> tensor_, data_, kv_replicas_;  // kv_replicas_: null unless t > Hkv
  std::unique_ptr<Comm> context_, replicas_;
  std::unique_ptr<Comm> pipeline_, tied_;  // tied_: the first and last stages (p > 1)
  std::unique_ptr<ExpertGroups> experts_;
};

}  // namespace slimpi
