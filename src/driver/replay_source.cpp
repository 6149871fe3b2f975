#include "driver/replay_source.h"

#include <slimpi/error.h>

#include <cmath>

#include "driver/run_components.h"
#include "io/rollout_log.h"
#include "parallel/mpi_bytes.h"

namespace slimpi {

ReplaySource::ReplaySource(const RunContext& ctx, const RunComponents& parts, std::string path)
    : ctx_(ctx), parts_(parts), path_(std::move(path)) {}

ReplaySource::~ReplaySource() = default;

std::vector<Sample> ReplaySource::trainer_share(int64_t step) {
  std::vector<Sample> batch;
  run_on_all_and_agree(ctx_.world->world(), "debug.train_only: " + path_, [&] {
    if (!parts_.trainer) return;
    if (!recorded_) recorded_ = std::make_unique<RolloutLog>(RolloutLog::open(path_, MPI_COMM_NULL, false));
    const std::vector<Sample> rows = recorded_->read_trained(step);
    SLIMPI_CHECK(!rows.empty(), "{} has no samples of step {}", path_, step);
    // Tensor, context and pipeline parallelism: the ranks of a block take the same share.
    const size_t tp = size_t(parts_.sample_block);
    const size_t T = parts_.trainer_world_ranks.size() / tp, N = rows.size();
    const size_t me = static_cast<size_t>(rank_in(ctx_.world->trainer())) / tp;
    for (size_t i = me * N / T; i < (me + 1) * N / T; ++i) {
      // What the router sent: the rollout fields, the post-processed reward and (a teacher
      // on the router) the teacher's log-probs; the trainer recomputes everything else as
      // the recorded run did (a teacher on the trainers: its log-probs too).
      Sample s = rows[i];
      SLIMPI_CHECK(std::isfinite(s.reward), "{}: step {} sample (group {}, index {}) has reward {}", path_, step,
                   s.group_index, s.index, s.reward);
      for (auto* field : {&s.old_log_probs, &s.ref_log_probs, &s.kl, &s.raw_advantages, &s.advantages, &s.values,
                          &s.returns})
        field->clear();
      batch.push_back(std::move(s));
    }
  });
  return batch;
}

}  // namespace slimpi
