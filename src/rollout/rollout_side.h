// RolloutSide — the generation half of the RL step as the driver sees it: an engine
// model, the communicator its engines span, the [rollout] settings. It owns this
// rank's Engine, built at the first generate() and reused for the rest of the run (its
// KV pool is allocated once; its prefix cache serves every call until the weights
// change, then it is invalidated without freeing the pool), and routes prompts through
// every engine. offload() frees the engine and its pool (colocated placement with
// rollout.offload_between_phases: training gets the memory back); the next generate()
// builds it again.
// Group seeds are mix_seed(run seed, stream, group index): the driver uses the step as
// the stream for training rollouts and a separate range for evaluation.
// Tensor-parallel engines (rollout.tensor_parallel = e): `engines` holds each engine's
// first rank (the leader, which routes and samples); the group's other ranks (followers,
// whose model is a shard with tensor rank > 0) pass MPI_COMM_NULL and, in generate() and
// evaluate() (and, under train.async = "full", in each run of the stream: AsyncGenerator
// calls follow()), run their leader's forwards until it releases them
// (rollout/engine_group.h).
// With rollout.prefill_ranks = n the last n engines are prefill engines and generate()
// routes through both pools (rollout/disaggregated_router.h, and with an environment
// rollout/disaggregated_episodes.h).
// With rollout.environment every sample is a multi-turn episode (rollout/episode_runner.h):
// the engine rank (the group's leader; a decode engine, never a prefill engine) holds the
// environment for the whole run and runs the episodes of the groups routed to it; the
// reward is the episode's. Under
// train.async = "full" the stream has its own episode runner and environment processes.
// Owned by the driver on rollout ranks; collective over the engines' communicator and
// the engine groups.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/prompt_source.h"
#include "reward/reward.h"
#include "rollout/rollout_config.h"
#include "rollout/router.h"
#include "rollout/streaming_router.h"

namespace slimpi {

class EngineFollower;
class Environment;
class EpisodeRunner;

class RolloutSide {
 public:
  // engine_group: this rank's tensor-parallel engine (MPI_COMM_NULL: engines of one rank).
  RolloutSide(const RolloutConfig& cfg, const Transformer& model, MPI_Comm engines, uint64_t run_seed,
              MPI_Comm engine_group = MPI_COMM_NULL);
  ~RolloutSide();

  // Generates n_samples per prompt; group g = first_group + i for prompts[i]. Returns
  // every sample on engine rank 0 (the router), nothing elsewhere. `stats` gets the
  // engine counters summed over the engines; `tail_s` (router) the long tail: the
  // seconds from the return of the group that completed 90% of the groups to the last's.
  std::vector<Sample> generate(const std::vector<Prompt>& prompts, int64_t first_group, uint64_t stream,
                               int64_t n_samples, const SamplingParams& params, EngineStats* stats,
                               double* tail_s = nullptr);

  // Held-out evaluation (see rollout/evaluation.h): eval/* metrics on the router.
  std::map<std::string, double> evaluate(const std::vector<Prompt>& prompts, const RewardConfig& reward,
                                         int64_t n_samples, uint64_t stream);

  // train.async = "full": the generator that keeps work in this rank's engine across
  // calls (built at the first call; the same engine generate() uses, which finds it
  // empty: StreamingRouter::update_weights parks the work before eval).
  StreamingRouter& stream();

  // Frees this rank's engine and KV pool until the next generate().
  void offload();
  bool is_router() const { return rank_ == 0; }
  // A tensor-parallel engine's rank other than its first.
  bool is_follower() const;
  // Follower: runs its leader's forwards until the leader's call (generate, a stream
  // run) is done. Returns the seconds spent in forwards.
  double follow();
  MPI_Comm engines() const { return engines_; }
  const RolloutConfig& config() const { return cfg_; }
  int64_t weight_version() const { return weight_version_; }
  void set_weight_version(int64_t v) { weight_version_ = v; }

 private:
  // This rank's engine, built at first use, told of a weight version it has not seen.
  Engine& current_engine();

  RolloutConfig cfg_;
  const Transformer& model_;
  MPI_Comm engines_;
  uint64_t run_seed_;
  MPI_Comm engine_group_;
  int rank_ = -1;  // in `engines` (-1: a follower)
  int64_t weight_version_ = 0;
  std::unique_ptr<Engine> engine_;
  // train.async = "full" with rollout.environment: the stream's episodes and their own
  // environment (an evaluation between runs uses env_), kept for the run.
  std::unique_ptr<Environment> stream_env_;
  std::unique_ptr<EpisodeRunner> stream_episodes_;
  std::vector<Prompt> no_prompts_;  // the stream's episodes get their records with their work
  std::unique_ptr<StreamingRouter> stream_;
  std::unique_ptr<EngineFollower> follower_;  // followers: their KV cache and forward loop
  std::unique_ptr<Environment> env_;          // rollout.environment: built at the first generate(), kept for the run
};

}  // namespace slimpi
