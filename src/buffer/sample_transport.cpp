#include "buffer/sample_transport.h"

#include <algorithm>

#include "core/byte_codec.h"
#include "parallel/mpi_bytes.h"

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
      send_message(world, encode_train_samples(share), trainer_world_ranks[i], kTagTrainBatch);
    }
    return mine;
  }
  if (std::find(trainer_world_ranks.begin(), trainer_world_ranks.end(), me) == trainer_world_ranks.end()) return mine;
  static const std::string context = "[trainer] wait for the step's samples from the router";
  return decode_train_samples(recv_message(world, router_world_rank, kTagTrainBatch, context));
}

}  // namespace slimpi
