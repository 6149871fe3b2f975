// The SFT term: L = Σ −logp · w over the response tokens (train/rl_objective.h), with
// train/loss and train/entropy_loss.
#include "train/loss/loss_term.h"
#include "train/metric_sums.h"
#include "train/rl_objective.h"

namespace slimpi {
namespace {

class SftTerm final : public LossTerm {
 public:
  const char* name() const override { return "sft"; }
  void declare_metrics(MetricSums& sums) const override {
    for (const char* k : {"train/loss", "train/entropy_loss"}) sums.add_value(k, 0.0);
  }
  at::Tensor add_to(at::Tensor, const MicroBatchView& mb, MetricSums& sums) const override {
    return sft_objective(mb.scored, sums);
  }
};

}  // namespace

std::unique_ptr<LossTerm> make_sft_term() { return std::make_unique<SftTerm>(); }

}  // namespace slimpi
