#include "train/trainer_config.h"

#include <slimpi/deck.h>
#include <slimpi/error.h>

#include "train/advantages.h"

namespace slimpi {

namespace {

// Routing replay and the routers' losses: a mixture-of-experts RL policy's.
void refuse_moe_combinations(const TrainerConfig& c, const Deck& deck) {
  if (c.routing_replay && c.mode != "rl")
    SLIMPI_FAIL_ALL("train.routing_replay ({}) replays the experts the rollout engine chose; train.mode = \"{}\" ({}) "
                    "has no rollouts",
                    deck.source("train.routing_replay"), c.mode, deck.source("train.mode"));
  if (c.routing_replay && deck.get_int("model.n_experts") == 0)
    SLIMPI_FAIL_ALL("train.routing_replay ({}) replays the experts of a mixture-of-experts policy, but model.n_experts "
                    "= 0 ({})",
                    deck.source("train.routing_replay"), deck.source("model.n_experts"));
  if (c.routing_replay_gap && !c.routing_replay)
    SLIMPI_FAIL_ALL("train.routing_replay_gap ({}) measures what routing replay changes; train.routing_replay = false ({})",
                    deck.source("train.routing_replay_gap"), deck.source("train.routing_replay"));
  if (deck.get_int("model.n_experts") == 0)
    for (const char* k : {"train.moe_aux_loss_coef", "train.moe_z_loss_coef"})
      if (!deck.has_default_value(k))
        SLIMPI_FAIL_ALL("{} ({}) weighs a mixture-of-experts router loss, but model.n_experts = 0 ({})", k,
                        deck.source(k), deck.source("model.n_experts"));
}

// The policy loss, the KL terms and the estimator's needs (slime's arguments.py asserts
// most of them); the critic's and GAE's keys where no critic would read them.
void refuse_objective_combinations(const TrainerConfig& c, const Deck& deck) {
  if (!c.use_tis && !deck.has_default_value("train.tis_function"))
    SLIMPI_FAIL_ALL("train.tis_function ({}) is the correction of train.use_tis, which is false ({})",
                    deck.source("train.tis_function"), deck.source("train.use_tis"));
  if (c.eps_clip_c != 0.0 && c.eps_clip_c <= 1.0)
    SLIMPI_FAIL_ALL("train.eps_clip_c = {} ({}): the dual clip needs c > 1 (or 0 for off)", c.eps_clip_c,
                    deck.source("train.eps_clip_c"));
  if (c.kl_coef != 0.0 && c.kl_loss_coef != 0.0)
    SLIMPI_FAIL_ALL("train.kl_coef = {} ({}) and train.kl_loss_coef = {} ({}) are both non-zero: use the reward-side "
                    "KL or the KL loss, not both (as slime)",
                    c.kl_coef, deck.source("train.kl_coef"), c.kl_loss_coef, deck.source("train.kl_loss_coef"));
  const std::string& estimator = c.estimator->name;
  if (c.mode == "rl" && c.estimator->needs_normalized_advantages && !c.normalize_advantages)
    SLIMPI_FAIL_ALL("train.advantage_estimator = \"{}\" ({}) needs train.normalize_advantages = true, as in slime; "
                    "it is false ({}): set it",
                    estimator, deck.source("train.advantage_estimator"), deck.source("train.normalize_advantages"));
  const bool critic = c.estimator->needs_critic;
  if (c.kl_coef != 0.0 && !c.estimator->reward_kl)
    SLIMPI_FAIL_ALL("train.kl_coef = {} ({}) acts only on the reinforce_plus_plus and ppo estimators; "
                    "train.advantage_estimator = \"{}\" ({}) would ignore it (use train.kl_loss_coef)",
                    c.kl_coef, deck.source("train.kl_coef"), estimator, deck.source("train.advantage_estimator"));
  if (!c.use_kl_loss && c.kl_loss_coef != 0.0 && c.mode == "rl")
    SLIMPI_FAIL_ALL("train.kl_loss_coef = {} ({}) would be ignored: train.use_kl_loss = false ({})", c.kl_loss_coef,
                    deck.source("train.kl_loss_coef"), deck.source("train.use_kl_loss"));
  if (!critic || c.mode != "rl")
    for (const auto& [k, entry] : deck.entries())
      if (k.rfind("critic.", 0) == 0 && !deck.has_default_value(k))
        SLIMPI_FAIL_ALL("{} ({}) configures the critic of train.advantage_estimator = \"ppo\"; \"{}\" ({}) has none", k,
                        deck.source(k), estimator, deck.source("train.advantage_estimator"));
  if (const double lv = deck.get_float("train.lambd_value"); lv < 0 && lv != -1.0)
    SLIMPI_FAIL_ALL("train.lambd_value = {} ({}) is GAE's lambda of the value targets: a value in [0, 1], or -1 for "
                    "train.lambd's", lv, deck.source("train.lambd_value"));
  if (!critic)
    for (const char* k : {"train.lambd", "train.lambd_value"})
      if (!deck.has_default_value(k))
        SLIMPI_FAIL_ALL("{} ({}) is GAE's lambda of train.advantage_estimator = \"ppo\"; \"{}\" ({}) would ignore it",
                        k, deck.source(k), estimator, deck.source("train.advantage_estimator"));
}

// On-policy distillation: its keys without it, its teacher's placement.
void refuse_distillation_combinations(const TrainerConfig& c, const Deck& deck) {
  const bool opd = deck.get_float("train.opd_kl_coef") > 0;
  if (opd && c.mode != "rl")
    SLIMPI_FAIL_ALL("train.opd_kl_coef ({}) distils a teacher into the policy's own samples; train.mode = \"{}\" ({}) "
                    "has none", deck.source("train.opd_kl_coef"), c.mode, deck.source("train.mode"));
  if (opd && deck.get_string("teacher.path").empty())
    SLIMPI_FAIL_ALL("train.opd_kl_coef = {} ({}) needs a teacher: set teacher.path (a Hugging Face directory or a "
                    "slimpi checkpoint)", deck.get_float("train.opd_kl_coef"), deck.source("train.opd_kl_coef"));
  if (!opd)
    for (const char* k : {"teacher.path", "teacher.placement", "teacher.top_k", "train.opd_task_reward",
                          "train.opd_topk_loss_coef"})
      if (!deck.has_default_value(k))
        SLIMPI_FAIL_ALL("{} ({}) configures on-policy distillation, which train.opd_kl_coef = 0 ({}) leaves off", k,
                        deck.source(k), deck.source("train.opd_kl_coef"));
  if (opd && deck.get_float("train.opd_topk_loss_coef") == 0 && !deck.has_default_value("teacher.top_k"))
    SLIMPI_FAIL_ALL("teacher.top_k ({}) sizes the top-k distillation loss, which train.opd_topk_loss_coef = 0 ({}) "
                    "leaves off", deck.source("teacher.top_k"), deck.source("train.opd_topk_loss_coef"));
  if (opd && deck.get_string("teacher.placement") == "rollout") {
    const std::string& where = deck.source("teacher.placement");
    if (deck.get_string("parallel.placement") != "split")
      SLIMPI_FAIL_ALL("teacher.placement = \"rollout\" ({}) puts the teacher on the router, a rollout rank apart from "
                      "the trainers; parallel.placement = \"{}\" ({}) has none: use teacher.placement = \"trainer\"",
                      where, deck.get_string("parallel.placement"), deck.source("parallel.placement"));
    if (deck.get_float("train.opd_topk_loss_coef") > 0)
      SLIMPI_FAIL_ALL("teacher.placement = \"rollout\" ({}) with train.opd_topk_loss_coef ({}): the teacher's top-k "
                      "ids do not travel with the samples; use teacher.placement = \"trainer\"", where,
                      deck.source("train.opd_topk_loss_coef"));
    if (deck.get_string("train.async") == "full")
      SLIMPI_FAIL_ALL("teacher.placement = \"rollout\" ({}) with train.async = \"full\" ({}): the streaming rollout "
                      "does not score with a teacher yet; use teacher.placement = \"trainer\"", where,
                      deck.source("train.async"));
  }
}

// slime's rules (its arguments.py asserts them), keys a setting would ignore, and
// AdamW's ranges.
void refuse_bad_combinations(const TrainerConfig& c, const Deck& deck) {
  refuse_moe_combinations(c, deck);
  refuse_objective_combinations(c, deck);
  refuse_distillation_combinations(c, deck);
  if (c.adam.beta1 >= 1.0 || c.adam.beta2 >= 1.0)
    SLIMPI_FAIL_ALL("train.adam_beta1 = {} ({}) and train.adam_beta2 = {} ({}) must each be in [0, 1)", c.adam.beta1,
                    deck.source("train.adam_beta1"), c.adam.beta2, deck.source("train.adam_beta2"));
  if (c.adam.eps <= 0.0)
    SLIMPI_FAIL_ALL("train.adam_eps = {} ({}) must be > 0", c.adam.eps, deck.source("train.adam_eps"));
}

}  // namespace

TrainerConfig TrainerConfig::from_deck(const Deck& deck) {
  TrainerConfig c;
  c.mode = deck.get_string("train.mode");
  c.estimator = &advantage_estimators().get(deck.get_string("train.advantage_estimator"));
  c.eps_clip = deck.get_float("train.eps_clip");
  c.eps_clip_high = deck.get_float("train.eps_clip_high");
  if (c.eps_clip_high == 0.0) c.eps_clip_high = c.eps_clip;
  c.eps_clip_c = deck.get_float("train.eps_clip_c");
  c.use_kl_loss = deck.get_bool("train.use_kl_loss");
  c.kl_loss_coef = deck.get_float("train.kl_loss_coef");
  c.kl_loss_type = deck.get_string("train.kl_loss_type");
  c.kl_coef = deck.get_float("train.kl_coef");
  c.gamma = deck.get_float("train.gamma");
  c.entropy_coef = deck.get_float("train.entropy_coef");
  c.routing_replay = deck.get_bool("train.routing_replay");
  c.routing_replay_gap = deck.get_bool("train.routing_replay_gap");
  c.moe_aux_loss_coef = deck.get_float("train.moe_aux_loss_coef");
  c.moe_z_loss_coef = deck.get_float("train.moe_z_loss_coef");
  c.use_tis = deck.get_bool("train.use_tis");
  c.exact_on_policy = deck.get_string("train.on_policy") == "exact";
  c.rollouts_from_current_weights = deck.get_string("train.async") == "off" && !deck.get_bool("debug.train_only");
  c.recompute_old_log_probs = deck.get_bool("debug.recompute_old_log_probs");
  if (c.recompute_old_log_probs && !c.exact_on_policy)
    SLIMPI_FAIL_ALL("debug.recompute_old_log_probs ({}) applies to train.on_policy = \"exact\" only (without it the "
                    "old log-probs always come from the trainer's forward); train.on_policy is \"{}\" ({})",
                    deck.source("debug.recompute_old_log_probs"), deck.get_string("train.on_policy"),
                    deck.source("train.on_policy"));
  c.mismatch = MismatchConfig::from_deck(deck);
  c.calculate_per_token_loss = deck.get_bool("train.calculate_per_token_loss");
  // Log-probs are taken at the sampling temperature (greedy rollouts: 1).
  c.temperature = deck.get_float("rollout.temperature") > 0 ? deck.get_float("rollout.temperature") : 1.0;
  c.normalize_advantages = deck.get_bool("train.normalize_advantages");
  c.n_micro_batches = deck.get_int("train.n_micro_batches");
  c.max_tokens_per_micro_batch = deck.get_int("train.max_tokens_per_micro_batch");
  c.clip_grad = deck.get_float("train.clip_grad");
  c.skip_nonfinite_steps = deck.get_bool("train.skip_nonfinite_steps");
  c.grad_bucket_bytes = deck.get_int("train.grad_bucket_mb") << 20;
  c.overlap_grad_reduce = deck.get_bool("train.overlap_grad_reduce");
  c.distributed_optimizer = deck.get_bool("train.distributed_optimizer");
  c.mtp_loss_coef = deck.get_float("train.mtp_loss_coef");
  c.mtp_loss = deck.get_string("train.mtp_loss");
  c.mtp_distill_top_k = deck.get_int("train.mtp_distill_top_k");
  // Keys of the MTP loss on a policy without MTP layers, or of the distill loss under
  // "ce", would be ignored: refused, naming them.
  if (deck.get_int("model.mtp_num_layers") == 0)
    for (const char* key : {"train.mtp_loss_coef", "train.mtp_loss", "train.mtp_distill_top_k"})
      if (!deck.has_default_value(key))
        SLIMPI_FAIL_ALL("{} ({}) trains multi-token-prediction layers, but model.mtp_num_layers = 0 ({}): give the "
                        "model MTP layers or drop the key", key, deck.source(key), deck.source("model.mtp_num_layers"));
  if (c.mtp_loss != "distill" && !deck.has_default_value("train.mtp_distill_top_k"))
    SLIMPI_FAIL_ALL("train.mtp_distill_top_k ({}) applies to train.mtp_loss = \"distill\" only; train.mtp_loss is "
                    "\"{}\" ({})", deck.source("train.mtp_distill_top_k"), c.mtp_loss, deck.source("train.mtp_loss"));
  const std::string& recompute = deck.get_string("train.recompute");
  c.recompute = recompute == "full"        ? Transformer::Recompute::Full
                : recompute == "selective" ? Transformer::Recompute::Selective
                                           : Transformer::Recompute::None;
  c.precision = parse_precision(deck.get_string("train.precision"));
  c.adam.beta1 = deck.get_float("train.adam_beta1");
  c.adam.beta2 = deck.get_float("train.adam_beta2");
  c.adam.eps = deck.get_float("train.adam_eps");
  c.adam.weight_decay = deck.get_float("train.weight_decay");
  c.lr.style = deck.get_string("train.lr_schedule");
  c.lr.lr = deck.get_float("train.lr");
  c.lr.min_lr = deck.get_float("train.min_lr");
  c.lr.warmup_steps = deck.get_int("train.warmup_steps");
  c.lr.decay_steps = deck.get_int("train.lr_decay_steps");
  if (c.lr.decay_steps == 0) c.lr.decay_steps = deck.get_int("run.n_steps");
  c.lambd = deck.get_float("train.lambd");
  c.lambd_value = deck.get_float("train.lambd_value") < 0 ? c.lambd : deck.get_float("train.lambd_value");
  CriticConfig& k = c.critic;
  k.lr.style = deck.get_string("critic.lr_schedule");
  k.lr.lr = deck.get_float("critic.lr");
  k.lr.min_lr = deck.get_float("critic.min_lr");
  k.lr.warmup_steps = deck.get_int("critic.warmup_steps");
  k.n_epochs = deck.get_int("critic.n_epochs");
  k.lr.decay_steps = deck.get_int("critic.lr_decay_steps");
  if (k.lr.decay_steps == 0) k.lr.decay_steps = deck.get_int("run.n_steps") * k.n_epochs;
  k.weight_decay = deck.get_float("critic.weight_decay");
  k.clip_grad = deck.get_float("critic.clip_grad");
  k.value_clip = deck.get_float("critic.value_clip");
  k.warmup_rollouts = deck.get_int("critic.warmup_rollouts");
  k.init_from = deck.get_string("critic.init_from");
  k.seed = uint64_t(deck.get_int("run.seed"));
  c.opd_kl_coef = deck.get_float("train.opd_kl_coef");
  c.opd_task_reward = deck.get_bool("train.opd_task_reward");
  c.teacher_placement = deck.get_string("teacher.placement");
  c.opd_topk_loss_coef = deck.get_float("train.opd_topk_loss_coef");
  c.opd_top_k = deck.get_int("teacher.top_k");
  refuse_bad_combinations(c, deck);
  return c;
}

}  // namespace slimpi
