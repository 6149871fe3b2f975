// AsyncGenerator — train.async = "full" on the rollout ranks. Prompts are drawn as the
// engines have room, up to rollout.queue_batches batches ahead of the trainers (queued
// groups and groups in flight together); each finished group is scored and filtered
// at once, and a kept group waits in the queue. The buffer phase takes the next
// rollout_batch_size groups from it, generating more first if the queue is short.
//
// Group g is a counter over the run and samples with seed mix_seed(run seed,
// kFullAsyncStream, g); Sample::group_index is g, so (group_index, index) names one
// sample of the whole run, and rollouts.h5 holds each at most once.
// The queue is buffer/group_queue.h (staleness: rollout.max_staleness and
// rollout.stale_policy retire a group too old for its batch, and may draw it again). With rollout.mask_offpolicy_in_partial, tokens of a trained sample older
// than its newest are left out of the loss (loss_mask 0), as slime's
// --mask-offpolicy-in-partial-rollout.
// Checkpoint (save/load): the queue, the generated-but-unrecorded groups, all unfinished
// work (StreamingRouter::snapshot) and the prompts of open and queued groups, in
// async_queue.h5 / async_work.h5 (rollouts.h5's layout) and async_state.json.
// Owned by the full-async schedule (driver/schedule_full_async.cpp) on rollout ranks; the
// queue lives on the router (rollout rank 0).
#pragma once

#include <mpi.h>

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "buffer/group_queue.h"
#include "data/prompt_source.h"
#include "reward/reward.h"
#include "rollout/engine.h"
#include "rollout/streaming_router.h"

namespace slimpi {

class Deck;
class DynamicFilter;
class RolloutSide;
class Tokenizer;
struct RolloutBatch;

class AsyncGenerator {
 public:
  AsyncGenerator(const Deck& deck, RolloutSide& side, PromptSource& prompts, const Tokenizer& tokenizer,
                 uint64_t run_seed);

  // Collective over the rollout ranks: generates until `trainers_done` (an
  // MPI_Ibarrier the trainers enter when they finish training) completes. What
  // finishes now is trained at `next_step` at the earliest (its staleness is judged so).
  void generate_while_training(int64_t next_step, MPI_Request* trainers_done);
  // Collective: generates until rollout_batch_size fresh groups are queued, then (router)
  // moves them into batch.kept with Sample::step = `step`, and every group generated but
  // not trained since the last batch (filtered, stale) into batch.unused. With a dynamic
  // filter it stops once as many groups have finished since the last batch as a
  // synchronous step generates at most (max_sampling_rounds × over_sampling_batch_size,
  // or rollout_batch_size), and the batch is short, as that step's would be. Returns the
  // rollout/async/* metrics (router; empty elsewhere).
  std::map<std::string, double> take_batch(int64_t step, RolloutBatch& batch);
  // Collective: the engines take weights `version`; in-flight work per rollout.partial.
  void update_weights(int64_t version);
  // Seconds this rank spent on engine iterations (and, on the router, scoring) since
  // the last call.
  double take_busy_seconds();

  // Collective: every unfinished item and sample, gathered on the router.
  StreamState snapshot();
  // The router writes the checkpoint files into `dir` (with snapshot()'s state) and
  // returns the queued and open groups; other ranks return 0.
  int64_t save(const std::string& dir, StreamState state);
  // Router: continues from the files of save().
  void load(const std::string& dir);
  static const std::vector<std::string>& checkpoint_files();

 private:
  using QueuedGroup = GroupQueue::Group;
  StreamingRouter::Hooks hooks(std::function<bool()> should_pause);
  // One run of the stream; its engine counters and wall time count towards the batch.
  void run_stream(const std::function<bool()>& should_pause);
  std::optional<WorkItem> next_group();
  // A finished group waits to be scored; score_finished() scores all waiting ones in one
  // call of the reward style, between engine iterations (and after a run), then filters
  // and queues them.
  void on_group(std::vector<Sample> samples);
  void score_finished();
  bool is_router() const;

  const Deck& deck_;
  RolloutSide& side_;
  PromptSource& prompts_;
  const Tokenizer& tokenizer_;
  const DynamicFilter& filter_;
  RewardConfig reward_;
  uint64_t run_seed_;
  int64_t batch_groups_, queue_batches_, n_samples_;
  int64_t max_groups_per_batch_;  // finished groups between batches before a short one (filter on)
  bool mask_offpolicy_;
  PartialPolicy partial_;
  double busy_s_ = 0;

  // Router only.
  int64_t step_ = 0;                       // the earliest step what finishes now can train
  int64_t next_group_ = 0;
  std::map<int64_t, Prompt> open_prompts_;  // group -> its prompt, while it generates
  std::vector<QueuedGroup> unscored_;       // finished, not scored yet
  // Since the last batch.
  std::map<std::string, double> counts_;
  GroupQueue queue_;  // the kept groups waiting for their batch, the untrained samples (counts into counts_)
  int64_t groups_finished_ = 0, groups_filtered_ = 0, groups_env_failed_ = 0;
  bool said_short_batch_ = false;  // router: the short-batch warning is given once a job
  double score_s_ = 0;
  EngineStats streamed_;   // every rank: this engine's counters in the stream's runs
  double stream_s_ = 0;    // every rank: wall time of those runs
};

}  // namespace slimpi
