// PPO with a critic (train/critic.h): per-token rewards as reinforce_plus_plus's (R the
// raw reward, no group post-processing), A = GAE over the critic's values with γ and λ
// (train/gae.h); the critic's targets are the returns.
#include <slimpi/deck.h>
#include <slimpi/error.h>

#include "train/estimators/estimators.h"
#include "train/gae.h"

namespace slimpi {
namespace {

at::Tensor ppo_gae(const AdvantageInputs& in) {
  SLIMPI_CHECK(in.values.defined() && in.values.numel() == in.mask.numel(),
               "the ppo estimator needs the critic's value of every response token");
  return generalized_advantages(token_rewards(in), in.values, in.mask, in.gamma, in.lambd).advantages;
}

void check_ppo_deck(const Deck& deck) {
  if (deck.get_int("parallel.expert_parallel") > 1)
    SLIMPI_FAIL_ALL("train.advantage_estimator = \"ppo\" ({}) with parallel.expert_parallel = {} ({}): the critic is "
                    "not expert-parallel yet (it is split over the tensor group and replicated over the data-parallel "
                    "ranks)", deck.source("train.advantage_estimator"), deck.get_int("parallel.expert_parallel"),
                    deck.source("parallel.expert_parallel"));
}

}  // namespace

AdvantageEstimator ppo_estimator() {
  AdvantageEstimator e;
  e.name = "ppo";
  e.advantages = ppo_gae;
  e.centring = RewardCentring::None;
  e.needs_critic = true;
  e.reward_kl = true;
  e.check_deck = check_ppo_deck;
  return e;
}

}  // namespace slimpi
