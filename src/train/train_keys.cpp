// Deck keys of the trainer and the critic:
// declared beside the code that reads them, collected by deck_keys() (cli/deck_keys.cpp).
#include "deck/key_tables.h"

#include "train/advantages.h"
#include "train/lr_schedule.h"
#include "train/mismatch_correction.h"
#include "train/policy_loss.h"

namespace slimpi {

std::vector<KeySpec> train_keys() {
  return {
      // [critic]
      float_key("critic.lr", 1e-5, 0.0, 10.0, "", "ppo: the critic's peak learning rate"),
      float_key("critic.min_lr", 0.0, 0.0, 10.0, "", "ppo: the critic's cosine schedule floor"),
      choice_key("critic.lr_schedule", "constant", lr_schedules().names(), "ppo: the critic's schedule after warm-up"),
      int_key("critic.warmup_steps", 0, 0, 1e9, "steps", "ppo: the critic's linear learning-rate warm-up"),
      int_key("critic.lr_decay_steps", 0, 0, 1e9, "steps",
              "ppo, cosine: the critic step at which min_lr is reached (0 = run.n_steps x critic.n_epochs, the "
              "critic's steps with one optimizer step per rollout; set it with more)"),
      float_key("critic.weight_decay", 0.0, 0.0, 10.0, "", "ppo: the critic's AdamW weight decay (matrices only)"),
      float_key("critic.clip_grad", 1.0, 0.0, 1e9, "", "ppo: clip the critic's gradients to this L2 norm (0 = off)"),
      float_key("critic.value_clip", 0.2, 0.0, 1e9, "",
                "ppo: the value loss's clip of V - V_old (slime's --value-clip)"),
      int_key("critic.n_epochs", 1, 1, 1e6, "", "ppo: passes of critic updates over each rollout (its mini-batches as "
              "the policy's)"),
      int_key("critic.warmup_rollouts", 0, 0, 1e9, "rollouts",
              "ppo: the first rollouts train the critic alone (slime's --num-critic-only-steps)"),
      string_key("critic.init_from", "",
                 "ppo: the critic's trunk from this Hugging Face directory or trainer_state.h5 (its critic with the "
                 "value head, when a PPO run wrote it); \"\" = the policy's initial weights"),
      // [train]
      choice_key("train.mode", "rl", {"rl", "sft"},
                 "rl: policy-gradient steps on rollouts; sft: supervised steps on data.path"),
      int_key("train.global_batch_size", 64, 1, 1e9, "samples", "samples per optimizer step, over all trainer ranks"),
      int_key("train.num_steps_per_rollout", 0, 0, 1e6, "steps",
              "optimizer steps per rollout (0 = rollout samples / global_batch_size)"),
      float_key("train.gamma", 1.0, 0.0, 1.0, "", "discount of reinforce_plus_plus returns and of GAE (ppo)"),
      float_key("train.opd_kl_coef", 0.0, 0.0, 1e6, "",
                "on-policy distillation (> 0, with teacher.path): advantages minus this times the per-token reverse "
                "KL logp_student - logp_teacher, before whitening (slime's --opd-kl-coef)"),
      float_key("train.opd_topk_loss_coef", 0.0, 0.0, 1e6, "",
                "on-policy distillation: weight of a top-k distillation loss, the KL from the teacher's top-k "
                "(renormalised) to the student's softmax, differentiated through the student (0 = off)"),
      bool_key("train.opd_task_reward", true,
               "on-policy distillation: false = the task's reward is left out of the advantages (pure distillation; "
               "rewards are still scored and logged)"),
      float_key("train.lambd", 1.0, 0.0, 1.0, "", "ppo: GAE's lambda of the policy's advantages (slime's --lambd)"),
      float_key("train.lambd_value", -1.0, -1.0, 1.0, "",
                "ppo: GAE's lambda of the critic's value targets (VAPO's decoupled lambda): in [0, 1], or -1 = "
                "train.lambd"),
      float_key("train.kl_coef", 0.0, 0.0, 1e6, "", "reward-side KL penalty of the reinforce_plus_plus estimators"),
      int_key("train.n_micro_batches", 1, 1, 1e6, "", "micro-batches per rank per step (gradient accumulation)"),
      int_key("train.max_tokens_per_micro_batch", 0, 0, 1e9, "tokens",
              "> 0: dynamic micro-batches packed first-fit up to this many tokens (overrides n_micro_batches)"),
      float_key("train.lr", 1e-4, 0.0, 10.0, "", "peak learning rate"),
      float_key("train.min_lr", 0.0, 0.0, 10.0, "", "cosine schedule floor"),
      choice_key("train.lr_schedule", "constant", lr_schedules().names(), "learning-rate schedule after warm-up"),
      int_key("train.warmup_steps", 0, 0, 1e9, "steps", "linear warm-up steps"),
      int_key("train.lr_decay_steps", 0, 0, 1e9, "steps", "cosine: step at which min_lr is reached (0 = run.n_steps)"),
      float_key("train.weight_decay", 0.0, 0.0, 10.0, "", "AdamW decoupled weight decay (matrices only)"),
      float_key("train.adam_beta1", 0.9, 0.0, 1.0, "", "AdamW beta1"),
      float_key("train.adam_beta2", 0.999, 0.0, 1.0, "", "AdamW beta2"),
      float_key("train.adam_eps", 1e-8, 0.0, 1.0, "", "AdamW epsilon"),
      float_key("train.clip_grad", 1.0, 0.0, 1e9, "", "clip gradients to this global L2 norm (0 = off)"),
      bool_key("train.skip_nonfinite_steps", false,
               "skip an optimizer step whose loss or gradient norm is NaN/inf (counted as "
               "train/skipped_nonfinite_step) instead of stopping the job"),
      int_key("train.grad_bucket_mb", 32, 1, 1e5, "MB", "size of the buckets the gradients are all-reduced in"),
      choice_key("train.precision", "fp32", {"fp32", "bf16"},
                 "forward precision of training: bf16 = bf16 matrix products (autocast) with fp32 master "
                 "weights, gradients and AdamW state; log-probs and losses in fp32"),
      choice_key("train.on_policy", "approximate", {"approximate", "exact"},
                 "exact: the trainer computes every sampled token's log-prob with the engine's bits (batch-"
                 "invariant kernels in both forwards, docs/exact_on_policy.md); with train.async = \"off\" the old "
                 "log-probs are then the rollout's, without their forward pass. On the CPU, in fp32 or bf16 "
                 "(train.precision = rollout.precision); dense and MoE models with grouped-query, latent or Gated "
                 "DeltaNet attention; engines of the trainers' tensor size"),
      bool_key("debug.recompute_old_log_probs", false,
               "train.on_policy = \"exact\": compute the old log-probs by their forward pass anyway, to measure "
               "what skipping it saves and to see it give the rollout's bits"),
      choice_key("train.recompute", "none", {"none", "selective", "full"},
                 "activation recomputation in backward: selective = attention's inner products, full = each "
                 "layer's attention and dense MLP blocks (same gradients, less activation memory)"),
      bool_key("train.distributed_optimizer", false,
               "shard the fp32 AdamW moments over the data-parallel ranks (Megatron's distributed optimizer, "
               "ZeRO-1): gradients reduce-scattered, parameters all-gathered after each step"),
      float_key("train.mtp_loss_coef", 0.2, 0.0, 1e3, "",
                "weight of the multi-token-prediction layers' loss (model.mtp_num_layers > 0; slime's "
                "--mtp-loss-scaling-factor); 0 = a frozen draft (its layers not trained)"),
      choice_key("train.mtp_loss", "ce", {"ce", "distill"},
                 "the MTP layers' loss: ce = cross-entropy against the generated tokens; distill = soft "
                 "cross-entropy against the policy's own next-token distribution over its top-k"),
      int_key("train.mtp_distill_top_k", 8, 1, 1024, "tokens", "train.mtp_loss = \"distill\": the policy's top-k"),
      bool_key("train.overlap_grad_reduce", true,
               "all-reduce (with the distributed optimizer: reduce-scatter) each gradient bucket as soon as the "
               "last backward of a step has produced it (non-blocking, overlapping the rest of backward), as "
               "Megatron's overlap_grad_reduce"),
      choice_key("train.advantage_estimator", "grpo", advantage_estimators().names(),
                 "advantage estimator (and policy loss: gspo and cispo have their own)"),
      float_key("train.eps_clip", 0.2, 0.0, 10.0, "", "PPO clip: lower bound 1 - eps_clip"),
      float_key("train.eps_clip_high", 0.0, 0.0, 10.0, "", "PPO clip: upper bound 1 + eps_clip_high (0 = eps_clip)"),
      float_key("train.eps_clip_c", 0.0, 0.0, 1e6, "", "dual-clip constant c > 1 for negative advantages (0 = off)"),
      bool_key("train.use_kl_loss", false, "add a KL loss to a frozen reference policy"),
      float_key("train.kl_loss_coef", 0.0, 0.0, 1e6, "", "weight of the KL loss"),
      choice_key("train.kl_loss_type", "k1", kl_types().names(),
                 "KL estimator of the KL loss and of the reward-side KL (slime's default k1)"),
      float_key("train.entropy_coef", 0.0, -1e6, 1e6, "", "entropy bonus weight (loss -= coef * entropy)"),
      bool_key("train.use_tis", false, "truncated importance sampling against the rollout log-probs"),
      float_key("train.tis_clip", 2.0, 0.0, 1e6, "", "TIS upper clamp"),
      float_key("train.tis_clip_low", 0.0, 0.0, 1e6, "", "TIS lower clamp"),
      bool_key("train.routing_replay", false,
               "MoE: Rollout Routing Replay: the trainer runs each token through the experts the engine chose "
               "(rollouts.h5 routing), with its own router's weights over them"),
      bool_key("train.routing_replay_gap", false,
               "with routing_replay: also score each rollout without replay (one more forward per rollout, no grad) "
               "and log train/train_rollout_logprob_abs_diff_unreplayed, the gap replay removes"),
      float_key("train.moe_aux_loss_coef", 0.0, 0.0, 1e6, "",
                "MoE load-balancing loss weight (transformers' load_balancing_loss_func over all MoE layers)"),
      float_key("train.moe_z_loss_coef", 0.0, 0.0, 1e6, "", "MoE router z-loss weight: mean over tokens of logsumexp(router logits)²"),
      choice_key("train.tis_function", "vanilla", tis_functions().names(),
                 "with use_tis: vanilla = clamp the ratio to [tis_clip_low, tis_clip]; icepop = zero it outside; "
                 "mis = slime's train/inference mismatch correction (train.mis_*)"),
      choice_key("train.mis_level", "token", mis_levels().names(),
                 "mis: the ratio per token, per sample (product), or per sample's geometric mean"),
      choice_key("train.mis_mode", "truncate", mis_modes().names(),
                 "mis: cap the weight at mis_upper, clamp it to [mis_lower, mis_upper], or reject tokens outside"),
      float_key("train.mis_lower", 0.0, 0.0, 1e6, "", "mis: lower bound (0 = 1 / mis_upper)"),
      float_key("train.mis_upper", 2.0, 1e-6, 1e6, "", "mis: upper bound"),
      bool_key("train.mis_rs", false, "mis: rejection sampling: tokens whose ratio leaves [mis_rs_lower, mis_rs_upper] leave the loss"),
      choice_key("train.mis_rs_level", "token", mis_levels().names(), "mis: the ratio rejection sampling tests"),
      float_key("train.mis_rs_lower", 0.0, 0.0, 1e6, "", "mis: rejection lower bound (0 = the weight's)"),
      float_key("train.mis_rs_upper", 0.0, 0.0, 1e6, "", "mis: rejection upper bound (0 = the weight's)"),
      float_key("train.mis_rs_veto", 0.0, 0.0, 1.0, "",
                "mis: a sample with any token ratio below this leaves the loss whole (0 = off)"),
      bool_key("train.mis_batch_normalize", false, "mis: normalise the weights to mean 1 over the micro-batch"),
      bool_key("train.disable_rewards_normalization", false, "use raw rewards (no group centring)"),
      bool_key("train.disable_grpo_std_normalization", false, "centre group rewards but do not divide by std"),
      bool_key("train.normalize_advantages", false, "whiten advantages over all trainer ranks"),
      bool_key("train.calculate_per_token_loss", false,
               "token mean over the step instead of the mean over samples of each sample's token mean")
  };
}

}  // namespace slimpi
