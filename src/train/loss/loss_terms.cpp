#include "train/loss/loss_term.h"

#include "model/transformer.h"
#include "train/trainer_config.h"

namespace slimpi {

LossTerms build_loss_terms(const TrainerConfig& cfg, const Transformer& policy) {
  LossTerms terms;
  const bool rl = cfg.mode == "rl";
  terms.push_back(rl ? make_policy_objective_term(cfg) : make_sft_term());
  if (rl && cfg.opd_topk_loss_coef > 0) terms.push_back(make_opd_topk_term(cfg, policy));
  if (policy.config().n_experts > 0) terms.push_back(make_router_losses_term(cfg, policy));
  if (policy.n_mtp_layers() > 0 && cfg.mtp_loss_coef > 0) terms.push_back(make_mtp_term(cfg, policy));
  return terms;
}

}  // namespace slimpi
