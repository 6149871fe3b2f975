#include "buffer/sample_transport.h"

#include <algorithm>

#include "core/byte_codec.h"
#include "parallel/mpi_bytes.h"
#include "parallel/watchdog.h"

namespace slimpi {
namespace {
constexpr int kTagTrainBatch = 201;
}

std::string encode_train_samples(const std::vector<TrainSample>& samples) {
  ByteWriter w;
  w.put<uint64_t>(samples.size());
  for (const auto& s : samples) {
    w.put_vector(s.tokens);
    w.put(s.prompt_length);
    w.put_vector(s.loss_mask);
    w.put_vector(s.advantages);
    w.put_vector(s.old_log_probs);
    w.put_vector(s.ref_log_probs);
    w.put_vector(s.rollout_log_probs);
  }
  return w.take();
}

std::vector<TrainSample> decode_train_samples(const std::string& bytes) {
  ByteReader r(bytes);
  std::vector<TrainSample> out(r.get<uint64_t>());
  for (auto& s : out) {
    s.tokens = r.get_vector<int64_t>();
    s.prompt_length = r.get<int64_t>();
    s.loss_mask = r.get_vector<float>();
    s.advantages = r.get_vector<float>();
    s.old_log_probs = r.get_vector<float>();
    s.ref_log_probs = r.get_vector<float>();
    s.rollout_log_probs = r.get_vector<float>();
  }
  SLIMPI_CHECK(r.done(), "train-sample message has trailing bytes");
  return out;
}

std::vector<TrainSample> scatter_train_samples(MPI_Comm world, int router_world_rank,
                                               const std::vector<int>& trainer_world_ranks,
                                               const std::vector<TrainSample>& batch) {
  int me = 0;
  MPI_Comm_rank(world, &me);
  const size_t n_trainers = trainer_world_ranks.size();
  std::vector<TrainSample> mine;
  if (me == router_world_rank) {
    const size_t n = batch.size();
    for (size_t i = 0; i < n_trainers; ++i) {
      std::vector<TrainSample> share(batch.begin() + i * n / n_trainers, batch.begin() + (i + 1) * n / n_trainers);
      if (trainer_world_ranks[i] == me) {
        mine = std::move(share);
        continue;
      }
      std::string bytes = encode_train_samples(share);
      check_mpi(MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, trainer_world_ranks[i],
                         kTagTrainBatch, world),
                "MPI_Send(train samples)");
    }
    return mine;
  }
  if (std::find(trainer_world_ranks.begin(), trainer_world_ranks.end(), me) == trainer_world_ranks.end()) return mine;
  static const std::string context = "[trainer] wait for the step's samples from the router";
  MPI_Status status;
  {
    WaitGuard guard({&context, "MPI_Probe"});
    check_mpi(MPI_Probe(router_world_rank, kTagTrainBatch, world, &status), "MPI_Probe(train samples)");
  }
  int n = 0;
  MPI_Get_count(&status, MPI_BYTE, &n);
  std::string bytes(n, '\0');
  check_mpi(MPI_Recv(bytes.data(), n, MPI_BYTE, router_world_rank, kTagTrainBatch, world, MPI_STATUS_IGNORE),
            "MPI_Recv(train samples)");
  return decode_train_samples(bytes);
}

}  // namespace slimpi
