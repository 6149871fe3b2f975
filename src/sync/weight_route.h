// WeightRoute — how the policy's weights reach the engines, chosen once when the job
// builds its parts and used by every step's weight_sync phase, the final evaluation of
// the overlapped schedules, and SFT's evaluation (whose engine runs a gathered copy).
// Three routes:
//   colocated  the engines run the trainer's model, or a copy refreshed in place: whole
//              (gathered from the shards: SFT evaluation, a one-rank engine beside model
//              parallelism), this rank's tensor shard (with every expert), or the policy
//              in bf16 / through FP8 (colocated_route.cpp)
//   broadcast  trainer rank 0 sends the whole model in buckets over `sync` (gathered
//              from the shards under model parallelism); an fp8 rollout carries the FP8
//              image; a tensor-parallel engine's rank receives whole and keeps its shard
//              (broadcast_route.cpp)
//   sliced     every engine rank receives its shard from the trainer ranks that hold it,
//              over `sliced_sync` (sliced_route.cpp, the plan: sync/weight_sync_plan.h)
// A route owns what only it needs (its communicator, the whole-model buffers, the fp8
// image). Every rank calls push() (a rank with no part returns took_part = false), so
// collective calls line up. What an engine holds before its first sync and after a
// resume is sync/engine_weights.h.
#pragma once

#include <slimpi/deck.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "model/model_config.h"
#include "parallel/device.h"
#include "parallel/world.h"
#include "sync/weight_sync.h"

namespace slimpi {

class ModelParallel;
class Transformer;

struct WeightPush {
  bool took_part = false;  // false: this rank has no part (a trainer whose shards others send)
  int64_t version = 0;     // the version the engines now hold (split: the sender's)
  std::optional<WeightSyncStats> stats;  // split routes: the transfer's
  bool delta = false;  // rollout.weight_sync = "delta": the stats' density, anchor and resent apply
};

class WeightRoute {
 public:
  virtual ~WeightRoute() = default;
  // The policy's weights to the engines as `version`.
  virtual WeightPush push(int64_t version) = 0;
};

// What a route is built from: the rank's models (null where the rank holds none).
struct WeightRouteParts {
  const Deck& deck;
  const World& world;
  const DeviceChoice& device;
  const ModelConfig& model;
  Transformer* policy = nullptr;        // trainer ranks
  Transformer* engine = nullptr;        // the engines' own model where it is not the policy
  const ModelParallel* model_parallel = nullptr;  // trainer ranks
  bool rl = true;                       // train.mode = "rl" (SFT: the evaluation's refresh)
};

// The route of this job (rollout.weight_sync_route resolved; colocated placement and SFT:
// colocated). Collective over the world (the split routes make their communicators).
std::unique_ptr<WeightRoute> make_weight_route(const WeightRouteParts& parts);

// The three routes (what make_weight_route chooses between).
std::unique_ptr<WeightRoute> make_colocated_route(Transformer* policy, Transformer* engine, bool fp8);
std::unique_ptr<WeightRoute> make_broadcast_route(const WeightRouteParts& parts, int64_t bucket_bytes,
                                                  DeltaSyncConfig delta, bool check);
std::unique_ptr<WeightRoute> make_sliced_route(const WeightRouteParts& parts, int64_t bucket_bytes,
                                               DeltaSyncConfig delta, bool check);

// rollout.weight_sync_route resolved ("auto": sliced for tensor-parallel engines).
bool sliced_weight_sync(const Deck& deck, const WorldLayout& layout);

}  // namespace slimpi
