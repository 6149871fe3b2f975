// Moving a step's training samples from the router (rollout rank 0) to the trainer
// ranks: trainer i of T receives samples [i·N/T, (i+1)·N/T) of the router's batch (in
// group order), so the data-parallel split is fixed by the batch alone. Point-to-point
// over the world communicator; the router may itself be a trainer (colocated).
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include <slimpi/sample.h>

namespace slimpi {

// Called by the router and by every trainer (the router passes the whole batch;
// trainers pass nothing). Returns this rank's share (empty on a router that does not
// train). trainer_world_ranks: the trainers' ranks in `world`, in trainer-rank order.
// tensor_parallel t: the trainers form groups of t consecutive ranks (tensor ×
// context × pipeline parallelism, train/model_parallel.h: t = their product) and every rank of group g of
// T/t receives share [g·N/(T/t), (g+1)·N/(T/t)).
std::vector<Sample> scatter_samples(MPI_Comm world, int router_world_rank, const std::vector<int>& trainer_world_ranks,
                                    const std::vector<Sample>& batch, int tensor_parallel = 1);

}  // namespace slimpi
