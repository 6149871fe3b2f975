// The MTP layers' own loss (train/mtp_loss.h): the draft's cross-entropy (or distillation)
// at each depth, its gradient reaching the MTP layers alone.
#include <ATen/ATen.h>

#include "model/transformer.h"
#include "train/loss/loss_term.h"
#include "train/metric_sums.h"
#include "train/mtp_loss.h"
#include "train/trainer_config.h"

namespace slimpi {
namespace {

class MtpTerm final : public LossTerm {
 public:
  MtpTerm(const TrainerConfig& cfg, const Transformer& policy) : cfg_(cfg), policy_(policy) {}
  const char* name() const override { return "mtp"; }
  void declare_metrics(MetricSums& sums) const override { declare_mtp_metrics(policy_.n_mtp_layers(), sums); }
  at::Tensor add_to(at::Tensor loss, const MicroBatchView& mb, MetricSums& sums) const override {
    const MtpLossSpec spec{cfg_.mtp_loss_coef, cfg_.mtp_loss, cfg_.mtp_distill_top_k, mb.step_mtp_positions,
                           cfg_.precision};
    return loss + mtp_loss(policy_, mb.batch, mb.hidden, mb.masks, spec, sums);
  }

 private:
  const TrainerConfig& cfg_;
  const Transformer& policy_;
};

}  // namespace

std::unique_ptr<LossTerm> make_mtp_term(const TrainerConfig& cfg, const Transformer& policy) {
  return std::make_unique<MtpTerm>(cfg, policy);
}

}  // namespace slimpi
