// The policy objective of RL (train/rl_objective.h): the estimator's policy loss with the
// off-policy correction, the entropy bonus and the KL loss; train/loss, pg_loss,
// pg_clipfrac, ppo_kl, entropy_loss, train_rollout_logprob_abs_diff, the correction's
// metrics and train/ois (train.use_tis), train/kl_loss (train.use_kl_loss).
#include "train/loss/loss_term.h"
#include "train/metric_sums.h"
#include "train/mismatch_correction.h"
#include "train/rl_objective.h"
#include "train/trainer_config.h"

namespace slimpi {
namespace {

class PolicyObjectiveTerm final : public LossTerm {
 public:
  explicit PolicyObjectiveTerm(const TrainerConfig& cfg) : cfg_(cfg) {}
  const char* name() const override { return "policy_objective"; }
  void declare_metrics(MetricSums& sums) const override {
    for (const char* k : {"train/loss", "train/entropy_loss", "train/pg_loss", "train/pg_clipfrac", "train/ppo_kl",
                          "train/train_rollout_logprob_abs_diff"})
      sums.add_value(k, 0.0);
    if (cfg_.use_tis) {
      for (const std::string& k : mismatch_metric_names(cfg_.mismatch)) sums.add_value("train/" + k, 0.0);
      sums.add_value("train/ois", 0.0);
    }
    if (cfg_.use_kl_loss) sums.add_value("train/kl_loss", 0.0);
  }
  at::Tensor add_to(at::Tensor, const MicroBatchView& mb, MetricSums& sums) const override {
    return rl_objective(cfg_, mb.scored, sums);
  }

 private:
  const TrainerConfig& cfg_;  // the Trainer's, which outlives its terms
};

}  // namespace

std::unique_ptr<LossTerm> make_policy_objective_term(const TrainerConfig& cfg) {
  return std::make_unique<PolicyObjectiveTerm>(cfg);
}

}  // namespace slimpi
