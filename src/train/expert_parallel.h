// ExpertGroups — the communicators of expert parallelism (parallel.expert_parallel = G)
// over the trainer ranks, and the gathers that turn sharded experts back into whole
// models (weight sync, colocated engines, checkpoints).
//
// Trainer rank t (of N, N % G == 0) sits in expert-parallel group t / G at place t % G
// and holds experts [t%G · E/G, (t%G + 1) · E/G) of every MoE layer (model/moe.h):
//   group     the G consecutive trainer ranks that together hold every expert; each MoE
//             layer's token exchange runs over it
//   replicas  the N / G ranks at the same place in every group: they hold the same
//             experts, and reduce those experts' gradients among themselves
// Every other parameter is replicated on all N ranks and reduced over all of them.
// Under tensor parallelism N counts the data-parallel ranks of one tensor rank
// (train/model_parallel.h); sync/whole_model.h gathers whole models.
// Owned by the driver on trainer ranks; lives as long as the models that point at it.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "core/named_tensor.h"
#include "model/moe.h"
#include "parallel/comm.h"

namespace slimpi {

struct DeviceChoice;

class ExpertGroups {
 public:
  // Collective over `trainer`. size must divide the communicator's size.
  ExpertGroups(MPI_Comm trainer, int size, const DeviceChoice& device);
  ~ExpertGroups();
  ExpertGroups(const ExpertGroups&) = delete;
  ExpertGroups& operator=(const ExpertGroups&) = delete;

  ExpertShard shard() const { return {group_->rank(), group_->size(), group_.get()}; }
  Comm& group() const { return *group_; }
  Comm& replicas() const { return *replicas_; }
  int group_index() const { return group_index_; }

 private:
  MPI_Comm group_mpi_ = MPI_COMM_NULL, replicas_mpi_ = MPI_COMM_NULL;
  std::unique_ptr<Comm> group_, replicas_;
  int group_index_ = 0;
};

// `name` with the expert index of its ".mlp.experts.<e>." part moved by `shift`
// (unchanged when it has none).
std::string shift_expert_index(const std::string& name, int64_t shift);

// Every rank's expert tensors, named as the whole model names them. `local` lists this
// rank's tensors (names containing ".mlp.experts.<e>.", e in its block of n_local; one
// dtype; the same list up to the index on every rank). Collective over `shard.comm`.
// Returns them in rank order, on `local`'s device: on every rank (to_all), or on the
// group's rank 0 alone (the others send theirs and get `local` back; no rank but the
// root holds more than its own shard).
std::vector<NamedTensor> gather_expert_tensors(const ExpertShard& shard, int64_t n_local,
                                               const std::vector<NamedTensor>& local, bool to_all = true);

}  // namespace slimpi
