#include "parallel/world.h"

#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <unistd.h>

#include <climits>

#include "parallel/mpi_bytes.h"
#include "parallel/watchdog.h"

namespace slimpi {

const char* placement_name(Placement p) { return p == Placement::Split ? "split" : "colocate"; }

bool WorldLayout::is_trainer(int rank) const {
  return placement == Placement::Colocate || rank < n_trainer;
}
bool WorldLayout::is_rollout(int rank) const {
  return placement == Placement::Colocate || rank >= n_trainer;
}
int WorldLayout::engine_of(int rank) const {
  if (!is_rollout(rank)) return -1;
  return placement == Placement::Colocate ? rank / engine_size : (rank - n_trainer) / engine_size;
}
bool WorldLayout::leads_engine(int rank) const {
  return is_rollout(rank) &&
         (placement == Placement::Colocate ? rank % engine_size == 0 : (rank - n_trainer) % engine_size == 0);
}
bool WorldLayout::in_sync(int rank) const {
  return placement == Placement::Split && (rank == 0 || is_rollout(rank));
}
bool WorldLayout::in_sliced_sync(int rank) const {
  return placement == Placement::Split && (is_rollout(rank) || rank / trainer_tensor < trainer_expert);
}

WorldLayout resolve_layout(const Deck& deck, int world_size) {
  WorldLayout layout;
  layout.world_size = world_size;
  layout.trainer_tensor = int(deck.get_int("parallel.tensor_parallel"));
  layout.trainer_expert = int(deck.get_int("parallel.expert_parallel"));
  const int64_t e = deck.get_int("rollout.tensor_parallel");
  const std::string placement = deck.get_string("parallel.placement");
  int64_t t = deck.get_int("parallel.trainer_ranks");
  int64_t r = deck.get_int("parallel.rollout_ranks");
  auto at = [&](const char* key) { return fmt::format("{} = {} ({})", key, deck.get_int(key), deck.source(key)); };

  if (placement == "colocate") {
    layout.placement = Placement::Colocate;
    if ((t != 0 && t != world_size) || (r != 0 && r != world_size))
      SLIMPI_FAIL_ALL("parallel.placement = \"colocate\" puts every rank in both roles, but {} and "
                      "{} ask for a subset of the {} ranks: leave both at 0 or set them to {}",
                      at("parallel.trainer_ranks"), at("parallel.rollout_ranks"), world_size, world_size);
    layout.n_trainer = layout.n_rollout = world_size;
    // Colocated engines of e > 1 ranks are the trainer's tensor groups, running the
    // policy's own shards: e must be the trainer's tensor-parallel size.
    if (e > 1 && e != layout.trainer_tensor)
      SLIMPI_FAIL_ALL("rollout.tensor_parallel = {} ({}) makes engines of {} ranks; with parallel.placement = "
                      "\"colocate\" ({}) an engine of several ranks is one tensor group of the trainer, running its "
                      "shards, so it must equal parallel.tensor_parallel = {} ({}), or be 1 (each rank runs a whole "
                      "model gathered from the shards)",
                      e, deck.source("rollout.tensor_parallel"), e, deck.source("parallel.placement"),
                      layout.trainer_tensor, deck.source("parallel.tensor_parallel"));
    if (world_size % e != 0)
      SLIMPI_FAIL_ALL("rollout.tensor_parallel = {} ({}) makes engines of {} ranks: it must divide the job's {} ranks "
                      "(parallel.placement = \"colocate\", {})", e, deck.source("rollout.tensor_parallel"), e,
                      world_size, deck.source("parallel.placement"));
    layout.engine_size = static_cast<int>(e);
    return layout;
  }

  layout.placement = Placement::Split;
  if (world_size < 2)
    SLIMPI_FAIL_ALL("parallel.placement = \"split\" needs at least 2 ranks (one trainer, one rollout), "
                    "but the job has {}: start more ranks or set parallel.placement = \"colocate\"",
                    world_size);
  if (t == 0 && r == 0) {
    t = (world_size + 1) / 2;
    r = world_size - t;
  } else if (t == 0) {
    t = world_size - r;
  } else if (r == 0) {
    r = world_size - t;
  }
  if (t < 1 || r < 1 || t + r != world_size)
    SLIMPI_FAIL_ALL("parallel.placement = \"split\" needs parallel.trainer_ranks + "
                    "parallel.rollout_ranks = world size ({} ranks), each at least 1; got {}, {}",
                    world_size, at("parallel.trainer_ranks"), at("parallel.rollout_ranks"));
  layout.n_trainer = static_cast<int>(t);
  layout.n_rollout = static_cast<int>(r);
  if (r % e != 0)
    SLIMPI_FAIL_ALL("rollout.tensor_parallel = {} ({}) makes engines of {} rollout ranks: it must divide the {} "
                    "rollout ranks (parallel.rollout_ranks, {}; parallel.trainer_ranks, {})",
                    e, deck.source("rollout.tensor_parallel"), e, r, deck.source("parallel.rollout_ranks"),
                    deck.source("parallel.trainer_ranks"));
  layout.engine_size = static_cast<int>(e);
  return layout;
}

int rank_in(MPI_Comm comm) {
  if (comm == MPI_COMM_NULL) return -1;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}

int size_of(MPI_Comm comm) {
  if (comm == MPI_COMM_NULL) return 0;
  int size = 0;
  MPI_Comm_size(comm, &size);
  return size;
}

World::World(MPI_Comm world, const WorldLayout& layout) : layout_(layout), world_(world) {
  MPI_Comm_rank(world_, &rank_);
  int size = 0;
  MPI_Comm_size(world_, &size);
  SLIMPI_CHECK(size == layout_.world_size, "layout made for {} ranks used in a world of {}",
               layout_.world_size, size);
  char host[HOST_NAME_MAX + 1] = {0};
  gethostname(host, HOST_NAME_MAX);
  hostname_ = host;

  auto split = [&](bool member, MPI_Comm* out, const char* name) {
    check_mpi(MPI_Comm_split(world_, member ? 0 : MPI_UNDEFINED, rank_, out), name);
    if (*out != MPI_COMM_NULL) MPI_Comm_set_name(*out, name);
  };
  if (layout_.placement == Placement::Colocate) {
    check_mpi(MPI_Comm_dup(world_, &trainer_), "MPI_Comm_dup(trainer)");
    check_mpi(MPI_Comm_dup(world_, &rollout_), "MPI_Comm_dup(rollout)");
    MPI_Comm_set_name(trainer_, "trainer");
    MPI_Comm_set_name(rollout_, "rollout");
  } else {
    split(is_trainer(), &trainer_, "trainer");
    split(is_rollout(), &rollout_, "rollout");
  }
  split(layout_.in_sync(rank_), &sync_, "sync");
  split(layout_.in_sliced_sync(rank_), &sliced_sync_, "sliced_sync");
  if (layout_.engine_size == 1) {
    if (rollout_ != MPI_COMM_NULL) check_mpi(MPI_Comm_dup(rollout_, &engines_), "MPI_Comm_dup(engines)");
  } else {
    split(layout_.leads_engine(rank_), &engines_, "engines");
    const int engine = layout_.engine_of(rank_);
    check_mpi(MPI_Comm_split(world_, engine >= 0 ? engine : MPI_UNDEFINED, rank_, &engine_group_), "engine_group");
    if (engine_group_ != MPI_COMM_NULL) MPI_Comm_set_name(engine_group_, "engine_group");
  }
  if (engines_ != MPI_COMM_NULL) MPI_Comm_set_name(engines_, "engines");
}

World::~World() {
  for (MPI_Comm* c : {&trainer_, &rollout_, &sync_, &engines_, &engine_group_, &sliced_sync_})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

std::string World::describe() const {
  // Each rank contributes one fixed-width line; rank 0 prints them in rank order.
  constexpr int kLine = 160;
  std::string role = is_trainer() && is_rollout() ? "trainer+rollout" : is_trainer() ? "trainer" : "rollout";
  auto fmt_rank = [](int r) { return r < 0 ? std::string("-") : std::to_string(r); };
  std::string mine = fmt::format("{:>5}  {:<20} {:<16} {:>7} {:>7} {:>6} {:>4}", rank_,
                                 hostname_.substr(0, 20), role, fmt_rank(rank_in(trainer_)),
                                 fmt_rank(rank_in(rollout_)), fmt_rank(layout_.engine_of(rank_)),
                                 fmt_rank(rank_in(sync_)));
  mine.resize(kLine, ' ');
  std::string all(static_cast<size_t>(kLine) * size(), ' ');
  static const std::string context = "[start-up] the rank table";
  WaitGuard guard({&context, "MPI_Gather", size_t(kLine), "char", 0});
  MPI_Gather(mine.data(), kLine, MPI_CHAR, all.data(), kLine, MPI_CHAR, 0, world_);
  std::string out = fmt::format(
      "rank layout: placement {}, {} ranks ({} trainer, {} rollout; engines of {} rank{})\n"
      "{:>5}  {:<20} {:<16} {:>7} {:>7} {:>6} {:>4}",
      placement_name(layout_.placement), size(), layout_.n_trainer, layout_.n_rollout, layout_.engine_size,
      layout_.engine_size > 1 ? "s" : "", "rank",
      "host", "role", "trainer", "rollout", "engine", "sync");
  for (int r = 0; r < size(); ++r) {
    std::string line = all.substr(static_cast<size_t>(r) * kLine, kLine);
    line.erase(line.find_last_not_of(' ') + 1);
    out += "\n" + line;
  }
  return out;
}

}  // namespace slimpi
