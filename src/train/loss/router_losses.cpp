// The routers' auxiliary losses of an MoE policy (train/moe_terms.h): load balancing and
// z-loss of the micro-batch, weighted by its share of the step's tokens; with the
// routing agreement's counters among its declared metrics.
#include "model/transformer.h"
#include "train/loss/loss_term.h"
#include "train/metric_sums.h"
#include "train/moe_terms.h"
#include "train/packed_batch.h"

namespace slimpi {
namespace {

class RouterLossesTerm final : public LossTerm {
 public:
  RouterLossesTerm(const TrainerConfig& cfg, const Transformer& policy)
      : cfg_(cfg),
        k_(policy.config().n_experts_per_tok),
        sigmoid_(policy.config().moe_router == "sigmoid"),
        moe_layers_(moe_layer_indices(policy.config())) {}
  const char* name() const override { return "router_losses"; }
  void declare_metrics(MetricSums& sums) const override { declare_moe_metrics(moe_layers_, sums); }
  at::Tensor add_to(at::Tensor loss, const MicroBatchView& mb, MetricSums& sums) const override {
    const double share = double(mb.batch.tokens.size(0)) / mb.step_tokens;
    return add_router_losses(loss, *mb.trace, k_, sigmoid_, share, cfg_, sums, mb.staged_routing);
  }

 private:
  const TrainerConfig& cfg_;
  int64_t k_;                        // experts per token
  bool sigmoid_;                     // DeepSeekMoE's sigmoid routers
  std::vector<int64_t> moe_layers_;  // the model layer of each MoE layer
};

}  // namespace

std::unique_ptr<LossTerm> make_router_losses_term(const TrainerConfig& cfg, const Transformer& policy) {
  return std::make_unique<RouterLossesTerm>(cfg, policy);
}

}  // namespace slimpi
