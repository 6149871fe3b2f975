// TrainerConfig — the train.* keys a trainer rank reads, resolved once from the deck
// (from_deck also refuses the combinations slime refuses and the keys a setting would
// ignore). A plain value, copied into the Trainer.
#pragma once

#include <cstdint>
#include <string>

#include "model/precision.h"
#include "train/adamw.h"
#include "train/advantages.h"
#include "train/lr_schedule.h"
#include "train/mismatch_correction.h"

namespace slimpi {

class Deck;

// [critic]: the value model of the ppo estimator (train/critic.h).
struct CriticConfig {
  LrSchedule lr;
  double weight_decay = 0.0;
  double clip_grad = 1.0;
  double value_clip = 0.2;       // slime's --value-clip
  int64_t n_epochs = 1;          // passes over each rollout
  int64_t warmup_rollouts = 0;   // rollouts the critic trains alone (slime's --num-critic-only-steps)
  std::string init_from;         // "" = the policy's trunk
  uint64_t seed = 0;             // the run seed: the fresh value head's stream
};

struct TrainerConfig {
  std::string mode = "sft";                  // "sft" | "rl"
  // train.advantage_estimator, resolved (train/estimators/): its formula, centring, policy loss and needs
  const AdvantageEstimator* estimator = &advantage_estimators().get("grpo");
  double eps_clip = 0.2;
  double eps_clip_high = 0.2;
  double eps_clip_c = 0.0;  // dual clip when > 1
  bool use_kl_loss = false;
  double kl_loss_coef = 0.0;
  std::string kl_loss_type = "k1";
  double kl_coef = 0.0;  // reward-side KL (reinforce_plus_plus estimators)
  double gamma = 1.0;    // discount of reinforce_plus_plus returns and of GAE
  double lambd = 1.0;    // GAE's λ of the policy's advantages (ppo)
  double lambd_value = 1.0;  // GAE's λ of the critic's targets (ppo; VAPO's decoupled λ)
  double entropy_coef = 0.0;
  bool routing_replay = false;     // MoE: every forward runs the experts the rollout's tokens ran (R3)
  bool routing_replay_gap = false;  // with it: also the rollout's log-prob gap without replay (a forward more per rollout)
  double moe_aux_loss_coef = 0.0;  // MoE policies: load-balancing and router z-loss weights
  double moe_z_loss_coef = 0.0;
  bool use_tis = false;
  // train.on_policy = "exact" (kernels/batch_invariant.h): the engine's log-probs are the
  // trainer's bit for bit; with rollouts of the current weights the old log-probs are then
  // the rollout's (no forward pass of their own: Trainer::old_from_rollout).
  bool exact_on_policy = false;
  bool rollouts_from_current_weights = true;  // train.async = "off" and not debug.train_only
  bool recompute_old_log_probs = false;  // debug.recompute_old_log_probs: the pass runs anyway
  MismatchConfig mismatch;  // with use_tis: the correction (train/mismatch_correction.h)
  bool calculate_per_token_loss = false;
  bool normalize_advantages = false;
  double temperature = 1.0;  // log-probs from logits / temperature
  int64_t n_micro_batches = 1;
  int64_t max_tokens_per_micro_batch = 0;  // > 0: dynamic micro-batches
  double clip_grad = 1.0;
  bool skip_nonfinite_steps = false;  // else a non-finite loss or gradient norm is an error
  int64_t grad_bucket_bytes = 32 << 20;
  bool overlap_grad_reduce = true;        // reduce buckets from inside the last backward (GradBuffer)
  bool distributed_optimizer = false;  // AdamW state sharded over data-parallel ranks (train/distributed_optimizer.h)
  Transformer::Recompute recompute = Transformer::Recompute::None;  // train.recompute
  // Multi-token prediction (model.mtp_num_layers > 0, train/mtp_loss.h): the MTP layers'
  // loss weight (0: a frozen draft, its parameters left out of the optimizer), "ce" or
  // "distill", and distill's top-k.
  double mtp_loss_coef = 0.2;
  std::string mtp_loss = "ce";
  int64_t mtp_distill_top_k = 8;
  Precision precision = Precision::FP32;  // of the forward; masters, gradients, AdamW stay fp32
  AdamW::Options adam;
  LrSchedule lr;
  CriticConfig critic;  // used when the estimator needs a critic (ppo)
  // On-policy distillation (a teacher, driver/teacher_model.h): A ← A − opd_kl_coef·(logp −
  // logp_teacher) per token before whitening (0 = off); opd_task_reward false: the task's
  // reward is left out of the advantages (pure distillation).
  double opd_kl_coef = 0.0;
  bool opd_task_reward = true;
  std::string teacher_placement = "trainer";  // "trainer": scored in prepare_rollout; "rollout": by the router
  // The top-k distillation loss: coef · Σ_t w_t Σ_{j ∈ top-k} q_j (log q_j − log p_θ(j)),
  // q the teacher's top-k renormalised, p_θ the student's softmax (0 = off).
  double opd_topk_loss_coef = 0.0;
  int64_t opd_top_k = 16;

  static TrainerConfig from_deck(const Deck& deck);
};

}  // namespace slimpi
