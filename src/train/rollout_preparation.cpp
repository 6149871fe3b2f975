// Trainer::prepare_rollout along its math (docs/rl_loop.md), once per rollout before its
// optimizer steps, as slime's actor does it:
//   1. score_rollout        reference log-probs (a KL term), old log-probs (several optimizer
//                           steps, the reward-side KL or distillation need them), the critic's
//                           values V_old (ppo), the teacher's log-probs (distillation)
//   2. score_sample         per sample: KL_t = k(logp_old, logp_ref); the estimator's A_t
//                           (train/estimators/); distillation's A_t − coef·(logp_old −
//                           logp_teacher); the critic's targets (GAE with λ_value)
//   3. add_replay_gap       train.routing_replay_gap: |logp without replay − logp_engine|
//   4. whiten               A over every sample of the rollout on every dp rank
//   5. rollout_metrics      the rollout/* means over samples, explained variance
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>

#include <cmath>
#include <limits>

#include "core/log.h"
#include "train/advantages.h"
#include "train/gae.h"
#include "train/metric_sums.h"
#include "train/packed_batch.h"
#include "train/policy_loss.h"
#include "train/teacher_scores.h"
#include "train/trainer.h"
#include "train/whitening.h"

namespace slimpi {

void Trainer::compute_log_probs(std::vector<Sample>& samples, bool reference) const {
  SLIMPI_CHECK(!reference || reference_, "no reference model");
  std::vector<std::vector<float>> logp = response_log_probs(samples, reference ? *reference_ : policy_,
                                                            cfg_.routing_replay);
  for (size_t i = 0; i < samples.size(); ++i)
    (reference ? samples[i].ref_log_probs : samples[i].old_log_probs) = std::move(logp[i]);
}

std::map<std::string, double> Trainer::prepare_rollout(std::vector<Sample>& local, bool recompute_old) {
  SLIMPI_CHECK(cfg_.mode == "rl", "prepare_rollout is for RL rollouts");
  SLIMPI_CHECK(!teacher_ || cfg_.opd_kl_coef > 0, "a teacher on the trainer needs train.opd_kl_coef > 0");
  // The student's log-probs of the reverse KL are the training recompute (slime's default).
  const bool with_old = recompute_old || cfg_.kl_coef != 0.0 || cfg_.opd_kl_coef > 0;
  score_rollout(local, with_old);
  MetricSums sums = declare_rollout_metrics(with_old);
  // train.routing_replay_gap: the rollout's log-probs under the weights that start it,
  // without replay (one more forward over the rollout).
  std::vector<std::vector<float>> unreplayed;
  if (cfg_.routing_replay_gap) unreplayed = response_log_probs(local, policy_, /*replay=*/false);
  std::vector<at::Tensor> advantages, masks, per_sample;  // [R_i] each; per_sample: m / Σm (a sample's token mean)
  for (size_t i = 0; i < local.size(); ++i) {
    Sample& s = local[i];
    masks.push_back(per_token_tensor(s.loss_mask, s.response_length(), 1.0f, at::kCPU));  // [R]
    per_sample.push_back(masks.back() / std::max(mask_sum(s), 1.0));
    advantages.push_back(score_sample(s, masks.back(), per_sample.back(), with_old, sums));
    if (!unreplayed.empty()) add_replay_gap(s, unreplayed[i], masks.back(), per_sample.back(), sums);
  }
  // Whitening: once per rollout, over every sample of it on every dp rank (slime).
  if (cfg_.normalize_advantages) whiten_advantages(advantages, masks, dp_);
  for (size_t i = 0; i < local.size(); ++i) {
    at::Tensor a = advantages[i].contiguous();
    local[i].advantages.assign(a.data_ptr<float>(), a.data_ptr<float>() + a.numel());
    sums.add("rollout/advantages", a, per_sample[i]);
  }
  sums.add_value("rollout/n_samples", double(local.size()));
  return rollout_metrics(sums.reduce(dp_));
}

bool Trainer::old_from_rollout(const std::vector<Sample>& local) const {
  if (!cfg_.exact_on_policy || !cfg_.rollouts_from_current_weights || cfg_.recompute_old_log_probs) return false;
  // Every response token of every sample sampled by one version of the weights, the same
  // on every data-parallel rank (the rollout of this step: the loop is synchronous and the
  // rollouts were not replayed from a file), with its rollout log-prob, and no token the
  // engine did not sample (an environment's observation tokens carry a placeholder 0).
  // Agreed over dp, since the forward it replaces is collective there.
  int64_t ok = 1, lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  for (const Sample& s : local) {
    const int64_t R = s.response_length();
    if (int64_t(s.rollout_log_probs.size()) != R || int64_t(s.weight_versions.size()) != R) ok = 0;
    for (int64_t v : s.weight_versions) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    for (float m : s.loss_mask)
      if (m != 1.0f) ok = 0;
  }
  if (dp_) {
    int64_t neg_lo = -lo, agree[3] = {-ok, neg_lo, hi};  // one MAX: of -ok (any 0 wins), of -lo, of hi
    dp_->allreduce(agree, 3, DType::I64, ReduceOp::Max);
    ok = -agree[0];
    lo = -agree[1];
    hi = agree[2];
  }
  return ok == 1 && lo == hi;
}

void Trainer::score_rollout(std::vector<Sample>& local, bool with_old) {
  if (reference_) compute_log_probs(local, /*reference=*/true);
  if (with_old && old_from_rollout(local)) {  // exact on-policy: the engine's are the trainer's bits
    if (!said_old_from_rollout_)
      log::info("exact on-policy: the old log-probs are the rollout's, bit for bit the trainer's (their forward "
                "pass over the batch is skipped)");
    said_old_from_rollout_ = true;
    for (Sample& s : local) s.old_log_probs = s.rollout_log_probs;  // (for the KL and distillation terms below)
    old_from_first_step_ = true;
  } else if (with_old) {
    compute_log_probs(local, /*reference=*/false);
  }
  if (critic_) {  // the values before this rollout's critic steps: GAE's and the value loss's V_old
    std::vector<std::vector<float>> values = critic_->values(local);
    for (size_t i = 0; i < local.size(); ++i) local[i].values = std::move(values[i]);
  }
  if (teacher_)  // one prefill-only forward of the teacher (teacher.placement = "trainer")
    score_with_teacher(*teacher_, local, teacher_scoring(cfg_, policy_.config().vocab_size));
  if (cfg_.opd_kl_coef > 0)  // (teacher.placement = "rollout": the router scored them)
    for (const Sample& s : local)
      SLIMPI_CHECK(int64_t(s.teacher_log_probs.size()) == s.response_length(),
                   "sample (step {}, group {}, index {}) reached the trainer with {} teacher log-probs for {} tokens",
                   s.step, s.group_index, s.index, s.teacher_log_probs.size(), s.response_length());
}

MetricSums Trainer::declare_rollout_metrics(bool with_old) const {
  // The metric names depend on the configuration only, so that every dp rank reduces
  // the same list, whatever samples it holds.
  MetricSums sums;
  sums.add_value("rollout/advantages", 0.0);
  if (with_old) sums.add_value("rollout/log_probs", 0.0);
  if (reference_) sums.add_value("rollout/ref_log_probs", 0.0);
  if (reference_ && with_old) sums.add_value("rollout/kl", 0.0);
  if (cfg_.opd_kl_coef > 0) sums.add_value("train/opd_reverse_kl", 0.0);
  if (critic_)  // token sums over the rollout: Σm, Σm·G, Σm·G², Σm·(G − V), Σm·(G − V)²; per-sample means
    for (const char* k : {"ev/n", "ev/g", "ev/g2", "ev/e", "ev/e2", "train/values_mean", "train/returns_mean"})
      sums.add_value(k, 0.0);
  if (cfg_.routing_replay_gap) {
    sums.add_value("train/train_rollout_logprob_abs_diff_unreplayed", 0.0);
    sums.add_value("gap/weight", 0.0);
  }
  return sums;
}

at::Tensor Trainer::score_sample(Sample& s, const at::Tensor& mask, const at::Tensor& per_sample, bool with_old,
                                 MetricSums& sums) {
  const int64_t R = s.response_length();
  const bool opd = cfg_.opd_kl_coef > 0;
  AdvantageInputs in;
  in.reward = opd && !cfg_.opd_task_reward ? 0.0f : s.reward;  // pure distillation: no task reward
  in.mask = mask;
  in.kl_coef = cfg_.kl_coef;
  in.gamma = cfg_.gamma;
  in.lambd = cfg_.lambd;
  if (critic_) in.values = at::tensor(s.values);  // [R]
  if (!s.ref_log_probs.empty() && !s.old_log_probs.empty()) {
    at::Tensor kl = kl_estimate(at::tensor(s.old_log_probs), at::tensor(s.ref_log_probs), cfg_.kl_loss_type);
    s.kl.assign(kl.data_ptr<float>(), kl.data_ptr<float>() + R);
    if (cfg_.kl_coef != 0.0) in.kl = kl;  // slime: the KL enters the returns only when kl_coef != 0
    if (reference_ && with_old) sums.add("rollout/kl", kl, per_sample);
  }
  at::Tensor adv = cfg_.estimator->advantages(in).to(at::kFloat).contiguous();  // [R]
  if (opd) {  // slime's apply_opd_kl_to_advantages: A − coef·(logp − logp_teacher), every token
    const at::Tensor reverse_kl = at::tensor(s.old_log_probs) - at::tensor(s.teacher_log_probs);  // [R]
    adv = (adv - cfg_.opd_kl_coef * reverse_kl).contiguous();
    sums.add("train/opd_reverse_kl", reverse_kl, per_sample);
  }
  s.raw_advantages.assign(adv.data_ptr<float>(), adv.data_ptr<float>() + R);
  if (critic_) add_critic_targets(s, in, per_sample, sums);
  if (with_old) sums.add("rollout/log_probs", at::tensor(s.old_log_probs), per_sample);
  if (reference_) sums.add("rollout/ref_log_probs", at::tensor(s.ref_log_probs), per_sample);
  return adv;  // whitening replaces the tensors; raw_advantages keeps a copy
}

void Trainer::add_critic_targets(Sample& s, const AdvantageInputs& in, const at::Tensor& per_sample,
                                 MetricSums& sums) const {
  // The critic's targets: the same token rewards, GAE with λ_value.
  const at::Tensor g = generalized_advantages(token_rewards(in), in.values, in.mask, cfg_.gamma, cfg_.lambd_value)
                           .returns.contiguous();  // [R]
  s.returns.assign(g.data_ptr<float>(), g.data_ptr<float>() + g.numel());
  const at::Tensor e = g - in.values;
  sums.add("ev/n", at::ones_like(in.mask), in.mask);
  sums.add("ev/g", g, in.mask);
  sums.add("ev/g2", g * g, in.mask);
  sums.add("ev/e", e, in.mask);
  sums.add("ev/e2", e * e, in.mask);
  sums.add("train/values_mean", in.values, per_sample);
  sums.add("train/returns_mean", g, per_sample);
}

void Trainer::add_replay_gap(const Sample& s, const std::vector<float>& unreplayed, const at::Tensor& mask,
                             const at::Tensor& per_sample, MetricSums& sums) const {
  // Compared with train/train_rollout_logprob_abs_diff (the same with replay), weighted
  // as the loss weighs tokens.
  if (s.rollout_log_probs.empty()) return;
  const at::Tensor w = cfg_.calculate_per_token_loss ? mask : per_sample;  // [R]
  const at::Tensor gap = (at::tensor(unreplayed) - at::tensor(s.rollout_log_probs)).abs();
  sums.add("train/train_rollout_logprob_abs_diff_unreplayed", gap, w);
  sums.add_value("gap/weight", w.sum().item<double>());
}

std::map<std::string, double> Trainer::rollout_metrics(std::map<std::string, double> totals) const {
  const double n = std::max(totals["rollout/n_samples"], 1.0);
  std::map<std::string, double> metrics;
  for (const auto& [k, v] : totals)
    if (k.rfind("rollout/", 0) == 0 && k != "rollout/n_samples") metrics[k] = v / n;
  if (cfg_.opd_kl_coef > 0) metrics["train/opd_reverse_kl"] = totals["train/opd_reverse_kl"] / n;
  if (critic_) {
    for (const char* k : {"train/values_mean", "train/returns_mean"}) metrics[k] = totals[k] / n;
    const double N = std::max(totals["ev/n"], 1.0);
    const double var_g = totals["ev/g2"] / N - std::pow(totals["ev/g"] / N, 2);
    const double var_e = totals["ev/e2"] / N - std::pow(totals["ev/e"] / N, 2);
    metrics["train/explained_variance"] = var_g > 0 ? 1.0 - var_e / var_g : std::nan("");
  }
  if (totals.count("gap/weight") && totals["gap/weight"] > 0)
    metrics["train/train_rollout_logprob_abs_diff_unreplayed"] =
        totals["train/train_rollout_logprob_abs_diff_unreplayed"] / totals["gap/weight"];
  return metrics;
}

}  // namespace slimpi
