#include "buffer/sample_transport.h"

#include <algorithm>

#include "core/sample_codec.h"
#include "parallel/mpi_bytes.h"

namespace slimpi {
namespace {
constexpr int kTagTrainBatch = 201;
}

std::vector<Sample> scatter_samples(MPI_Comm world, int router_world_rank, const std::vector<int>& trainer_world_ranks,
                                    const std::vector<Sample>& batch, int tensor_parallel) {
  int me = 0;
  MPI_Comm_rank(world, &me);
  const size_t n_trainers = trainer_world_ranks.size(), tp = size_t(std::max(tensor_parallel, 1));
  const size_t n_shares = n_trainers / tp;
  std::vector<Sample> mine;
  if (me == router_world_rank) {
    const size_t n = batch.size();
    for (size_t i = 0; i < n_trainers; ++i) {
      const size_t g = i / tp;
      std::vector<Sample> share(batch.begin() + g * n / n_shares, batch.begin() + (g + 1) * n / n_shares);
      if (trainer_world_ranks[i] == me) {
        mine = std::move(share);
        continue;
      }
      send_message(world, encode_samples(share), trainer_world_ranks[i], kTagTrainBatch);
    }
    return mine;
  }
  if (std::find(trainer_world_ranks.begin(), trainer_world_ranks.end(), me) == trainer_world_ranks.end()) return mine;
  static const std::string context = "[trainer] wait for the step's samples from the router";
  return decode_samples(recv_message(world, router_world_rank, kTagTrainBatch, context));
}

}  // namespace slimpi
