// The broadcast route (sync/weight_route.h): trainer rank 0 sends the whole model in
// fixed-size buckets over `sync` (sync/weight_sync.h) to every rollout rank.
#include <ATen/ATen.h>
#include <slimpi/error.h>

#include <memory>

#include "model/precision.h"
#include "model/transformer.h"
#include "parallel/comm.h"
#include "parallel/watchdog.h"
#include "sync/fp8_weights.h"
#include "sync/weight_route.h"
#include "sync/whole_model.h"
#include "train/model_parallel.h"

namespace slimpi {
namespace {

class BroadcastRoute final : public WeightRoute {
 public:
  BroadcastRoute(const WeightRouteParts& p, int64_t bucket_bytes, DeltaSyncConfig delta, bool check)
      : policy_(p.policy),
        engine_(p.engine),
        model_parallel_(p.model_parallel),
        seed_(uint64_t(p.deck.get_int("run.seed"))),
        is_root_(p.world.rank() == 0),
        sender_(p.world.is_trainer()),
        raw_sync_(p.world.sync()),
        wire_(rollout_weight_dtype(p.deck.get_string("rollout.precision"))),
        fp8_(p.deck.get_string("rollout.precision") == "fp8"),
        check_(check),
        delta_(delta.enabled) {
    if (raw_sync_ == MPI_COMM_NULL) return;  // a trainer rank that only joins the gather
    comm_ = make_comm(raw_sync_, "sync", p.device);
    sync_ = std::make_unique<WeightSync>(*comm_, bucket_bytes, delta);
    if (engine_ && engine_->tensor_shard().size > 1)  // receives whole, keeps its shard
      whole_engine_ = std::make_unique<Transformer>(p.model, seed_, engine_->device(), engine_->weight_dtype());
    if (fp8_ && engine_ && !sender_)  // receives the fp8 image, keeps it
      fp8_image_ = std::make_unique<WeightImage>(fp8_weight_image(receiver(), /*quantize=*/false));
  }

  WeightPush push(int64_t version) override {
    gather_policy();
    // The engines already waited for the trainers (asleep) in the record phase's barrier.
    if (!sync_) return {};
    WeightPush out{true, version, std::nullopt};
    out.delta = delta_;
    const WeightImage image = image_to_send();
    out.stats = sync_->sync(image.params, &out.version, check_, image.flat);
    if (check_) agree_on_checksum(out.version, out.stats->checksum);
    if (fp8_ && !sender_) load_fp8_image(*fp8_image_, receiver());
    if (whole_engine_) engine_->copy_shard_from(*whole_engine_);
    return out;
  }

 private:
  // Model parallelism: trainer rank 0 pushes the whole policy, the groups' shards gathered.
  void gather_policy() {
    if (!policy_ || !policy_->sharded() || !model_parallel_->joins_gather_to_first()) return;
    if (is_root_ && !whole_policy_) whole_policy_ = std::make_unique<Transformer>(policy_->config(), seed_,
                                                                                 policy_->device());
    gather_whole_model(*policy_, whole_policy_.get(), /*to_all=*/false);  // to trainer rank 0
  }

  // An engine's whole model to receive into (a tensor-parallel engine's rank keeps its
  // shard of it after the sync).
  Transformer& receiver() { return whole_engine_ ? *whole_engine_ : *engine_; }

  // The weights in the engines' dtype: the sender's rounded from its masters when they
  // differ (bf16), the engines' own tensors to receive into. fp8 (sync/fp8_weights.h):
  // the sender quantises into the image it keeps, an engine receives into its own and
  // de-quantises it after the sync.
  WeightImage image_to_send() {
    const Transformer& whole = whole_policy_ ? *whole_policy_ : policy_ ? *policy_ : receiver();
    if (!fp8_) return weight_image(whole, wire_);
    if (sender_ && !fp8_image_)
      fp8_image_ = std::make_unique<WeightImage>(fp8_weight_image(whole, /*quantize=*/false));
    if (sender_) fill_fp8_image(whole, *fp8_image_);
    return *fp8_image_;
  }

  // rollout.check_weight_update: every engine's checksum against the trainer's.
  void agree_on_checksum(int64_t version, uint64_t mine) {
    uint64_t trainer_sum = mine;
    static const std::string context = "[weight_sync] the trainer's checksum";
    WaitGuard guard({&context, "MPI_Bcast", 1, "u64", 0});
    MPI_Bcast(&trainer_sum, 1, MPI_UINT64_T, 0, raw_sync_);
    SLIMPI_CHECK(trainer_sum == mine, "weight update {} arrived corrupted: checksum {:016x}, trainer's {:016x}",
                 version, mine, trainer_sum);
  }

  Transformer* policy_;                     // trainer ranks
  Transformer* engine_;                     // rollout ranks
  const ModelParallel* model_parallel_;     // trainer ranks
  uint64_t seed_;
  bool is_root_;                            // world rank 0 = trainer rank 0 = sync rank 0
  bool sender_;                             // a trainer rank
  MPI_Comm raw_sync_;                       // World::sync (MPI_COMM_NULL: not a member)
  at::ScalarType wire_;                     // the engines' weight dtype
  bool fp8_, check_, delta_;
  std::unique_ptr<Comm> comm_;              // over raw_sync_
  std::unique_ptr<WeightSync> sync_;
  std::unique_ptr<Transformer> whole_policy_;  // trainer rank 0 under model parallelism (made at the first sync)
  std::unique_ptr<Transformer> whole_engine_;  // a tensor-parallel engine's rank
  // fp8: an engine's last image received; trainer rank 0's buffer it quantises into (made at the first sync)
  std::unique_ptr<WeightImage> fp8_image_;
};

}  // namespace

std::unique_ptr<WeightRoute> make_broadcast_route(const WeightRouteParts& parts, int64_t bucket_bytes,
                                                  DeltaSyncConfig delta, bool check) {
  return std::make_unique<BroadcastRoute>(parts, bucket_bytes, delta, check);
}

}  // namespace slimpi
