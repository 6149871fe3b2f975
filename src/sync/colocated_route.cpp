// The colocated route (sync/weight_route.h): no transfer between sides. The engines
// run the trainer's model itself (nothing to do), or a copy of it refreshed here.
#include <memory>

#include "model/transformer.h"
#include "sync/fp8_weights.h"
#include "sync/weight_route.h"
#include "sync/whole_model.h"

namespace slimpi {
namespace {

class ColocatedRoute final : public WeightRoute {
 public:
  ColocatedRoute(Transformer* policy, Transformer* engine, bool fp8) : policy_(policy), engine_(engine), fp8_(fp8) {}

  WeightPush push(int64_t version) override {
    if (engine_ && policy_) {
      if (fp8_) copy_through_fp8(*policy_, *engine_);  // unsharded (check_run_deck)
      // this rank's tensor shard (experts gathered over the expert group), or a bf16 copy
      else if (engine_->sharded() || !policy_->sharded()) copy_tensor_shard(*policy_, *engine_);
      else gather_whole_model(*policy_, engine_);  // a whole model from the groups' shards
    }
    return {true, version, std::nullopt};
  }

 private:
  Transformer* policy_;  // the trainer's (null on ranks that do not train)
  Transformer* engine_;  // the engines' copy (null: they run the policy itself)
  bool fp8_;
};

}  // namespace

std::unique_ptr<WeightRoute> make_colocated_route(Transformer* policy, Transformer* engine, bool fp8) {
  return std::make_unique<ColocatedRoute>(policy, engine, fp8);
}

}  // namespace slimpi
