// The sliced route (sync/weight_route.h): each engine rank receives its shard from the
// trainer ranks that hold it, over `sliced_sync` (sync/weight_sync_plan.h).
#include <memory>

#include "model/precision.h"
#include "model/transformer.h"
#include "parallel/comm.h"
#include "sync/weight_route.h"
#include "sync/weight_sync_plan.h"

namespace slimpi {
namespace {

class SlicedRoute final : public WeightRoute {
 public:
  // Members of sliced_sync only: `local` the rank's model (a trainer's shard, an engine's).
  SlicedRoute(std::unique_ptr<Comm> comm, const ModelConfig& cfg, const SyncLayout& layout, int64_t bucket_bytes,
              DeltaSyncConfig delta, const Transformer* local, at::ScalarType wire, bool check)
      : comm_(std::move(comm)),
        sync_(comm_ ? std::make_unique<SlicedWeightSync>(*comm_, cfg, layout, bucket_bytes, delta) : nullptr),
        local_(local),
        wire_(wire),
        check_(check),
        delta_(delta.enabled) {}

  WeightPush push(int64_t version) override {
    if (!sync_) return {};  // a trainer rank whose shards others send
    WeightPush out{true, version, std::nullopt};
    out.stats = sync_->sync(local_->parameters(), wire_, &out.version, check_);
    out.delta = delta_;
    return out;
  }

 private:
  std::unique_ptr<Comm> comm_;  // sliced_sync (null: not a member)
  std::unique_ptr<SlicedWeightSync> sync_;
  const Transformer* local_;
  at::ScalarType wire_;  // the engines' weight dtype
  bool check_;           // rollout.check_weight_update
  bool delta_;           // rollout.weight_sync = "delta"
};

}  // namespace

std::unique_ptr<WeightRoute> make_sliced_route(const WeightRouteParts& p, int64_t bucket_bytes, DeltaSyncConfig delta,
                                               bool check) {
  const WorldLayout& layout = p.world.layout();
  std::unique_ptr<Comm> comm;
  if (p.world.sliced_sync() != MPI_COMM_NULL) comm = make_comm(p.world.sliced_sync(), "sliced_sync", p.device);
  const SyncLayout sl{layout.trainer_tensor, layout.trainer_expert, layout.n_rollout / layout.engine_size,
                      layout.engine_size};
  const Transformer* local = p.policy ? p.policy : p.engine;
  const at::ScalarType wire = rollout_weight_dtype(p.deck.get_string("rollout.precision"));
  return std::make_unique<SlicedRoute>(std::move(comm), p.model, sl, bucket_bytes, delta, local, wire, check);
}

}  // namespace slimpi
