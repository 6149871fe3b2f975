// World — the roles of the ranks and the communicators made from them (docs/architecture.md, the process model).
//
// Split placement: world ranks [0, n_trainer) train, [n_trainer, size) roll out, in
// engines of engine_size consecutive ranks (rollout.tensor_parallel; 1 by default).
// Colocate: every rank trains and rolls out; engines of engine_size consecutive ranks
// (1, or the trainer's tensor groups: rollout.tensor_parallel = parallel.tensor_parallel).
// Communicators (made once, collectively, in the constructor; freed in the destructor):
//   trainer       — the trainer ranks (MPI_COMM_NULL on pure rollout ranks)
//   rollout       — the rollout ranks (MPI_COMM_NULL on pure trainer ranks)
//   engines       — every engine's first rank (rank 0 routes); = rollout when engines are one rank
//   engine_group  — the ranks of this rank's engine (MPI_COMM_NULL when engines are one rank)
//   sync          — split only: trainer rank 0 (sync rank 0) + every rollout rank; the
//                   weight broadcast (rollout.weight_sync_route = "broadcast")
//   sliced_sync   — split only: the trainer ranks holding a distinct part of the model
//                   (the tensor groups of the first trainer_expert data-parallel indices)
//                   + every rollout rank; the planned weight sync (sync/weight_sync_plan.h)
// MPI_COMM_NULL where a rank is not a member.
// WorldLayout is the pure arithmetic (testable without MPI); World owns the MPI handles.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace slimpi {

class Deck;

enum class Placement { Split, Colocate };

struct WorldLayout {
  Placement placement = Placement::Split;
  int world_size = 1;
  int n_trainer = 1;  // ranks that train
  int n_rollout = 1;  // ranks that roll out
  int engine_size = 1;  // ranks per engine (rollout.tensor_parallel)
  int trainer_tensor = 1, trainer_expert = 1;  // parallel.tensor_parallel, parallel.expert_parallel

  bool is_trainer(int rank) const;
  bool is_rollout(int rank) const;
  // Engine index of a rollout rank, -1 for others.
  int engine_of(int rank) const;
  // Whether `rank` is the first rank of its engine.
  bool leads_engine(int rank) const;
  // Whether `rank` is a member of the sync / sliced_sync communicator.
  bool in_sync(int rank) const;
  bool in_sliced_sync(int rank) const;
};

// Resolves parallel.placement / trainer_ranks / rollout_ranks for `world_size` ranks.
// Throws a collective slimpi::Error naming every key involved when they cannot hold.
WorldLayout resolve_layout(const Deck& deck, int world_size);

class World {
 public:
  World(MPI_Comm world, const WorldLayout& layout);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  const WorldLayout& layout() const { return layout_; }
  MPI_Comm world() const { return world_; }
  MPI_Comm trainer() const { return trainer_; }
  MPI_Comm rollout() const { return rollout_; }
  MPI_Comm sync() const { return sync_; }
  MPI_Comm engines() const { return engines_; }
  MPI_Comm engine_group() const { return engine_group_; }
  MPI_Comm sliced_sync() const { return sliced_sync_; }
  int rank() const { return rank_; }
  int size() const { return layout_.world_size; }
  bool is_trainer() const { return layout_.is_trainer(rank_); }
  bool is_rollout() const { return layout_.is_rollout(rank_); }
  const std::string& hostname() const { return hostname_; }

  // The rank table (rank, host, role, rank in each communicator). Collective over the
  // world; the text is complete on rank 0.
  std::string describe() const;

 private:
  WorldLayout layout_;
  MPI_Comm world_;
  MPI_Comm trainer_ = MPI_COMM_NULL;
  MPI_Comm rollout_ = MPI_COMM_NULL;
  MPI_Comm sync_ = MPI_COMM_NULL;
  MPI_Comm engines_ = MPI_COMM_NULL;
  MPI_Comm engine_group_ = MPI_COMM_NULL;
  MPI_Comm sliced_sync_ = MPI_COMM_NULL;
  int rank_ = 0;
  std::string hostname_;
};

const char* placement_name(Placement p);
// Rank of this process in `comm`, or -1 for MPI_COMM_NULL.
int rank_in(MPI_Comm comm);
// Size of `comm`, or 0 for MPI_COMM_NULL.
int size_of(MPI_Comm comm);

}  // namespace slimpi
