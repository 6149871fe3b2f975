#include "train/trainer.h"

#include <fmt/format.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <cmath>

#include "core/timer.h"
#include "io/h5.h"
#include "io/tensor_io.h"
#include "parallel/comm_tensor.h"
#include "model/log_probs.h"
#include "train/advantages.h"
#include "train/expert_parallel.h"
#include "train/micro_batches.h"
#include "train/mismatch_correction.h"
#include "train/policy_loss.h"
#include "train/whitening.h"

namespace slimpi {
namespace {

at::Tensor as_tensor(const std::vector<float>& v, int64_t n, float fill, const at::Device& device) {
  if (v.empty()) return at::full({n}, fill, at::TensorOptions().dtype(at::kFloat).device(device));
  SLIMPI_CHECK(int64_t(v.size()) == n, "per-token vector of {} entries for {} response tokens", v.size(), n);
  return at::tensor(v, at::kFloat).to(device);
}

// One micro-batch packed for the model.
struct PackedBatch {
  at::Tensor tokens;  // [T]
  std::vector<int64_t> seq_lens, prompt_lens;
  at::Tensor sample_of_token;  // [N] index within the micro-batch
  at::Tensor support;          // [N] int64 sampling-support sizes (undefined: whole vocabulary everywhere)
};

PackedBatch pack(const std::vector<Sample>& samples, const std::vector<int64_t>& which, const at::Device& device) {
  PackedBatch b;
  std::vector<int64_t> tokens, owner;
  for (size_t j = 0; j < which.size(); ++j) {
    const Sample& s = samples[which[j]];
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
    b.seq_lens.push_back(static_cast<int64_t>(s.tokens.size()));
    b.prompt_lens.push_back(s.prompt_length);
    owner.insert(owner.end(), s.response_length(), static_cast<int64_t>(j));
  }
  b.tokens = at::tensor(tokens, at::kLong).to(device);
  b.sample_of_token = at::tensor(owner, at::kLong).to(device);
  bool truncated = false;
  for (int64_t i : which) truncated = truncated || !samples[i].sampling_support.empty();
  if (truncated) {
    std::vector<int64_t> support;
    for (int64_t i : which) {
      const Sample& s = samples[i];
      if (s.sampling_support.empty()) support.insert(support.end(), s.response_length(), 0);
      else support.insert(support.end(), s.sampling_support.begin(), s.sampling_support.end());
    }
    b.support = at::tensor(support, at::kLong).to(device);
  }
  return b;
}

// The model's logits [T, V] (fp32) for a packed micro-batch, its forward in `precision`
// (the scope of the autocast region is the forward alone; losses stay outside).
// The micro-batch's rollout routing traces packed like its tokens: [T, n_moe_layers, k]
// int64, -1 where a sample has none (its last token; a sample without a trace). A trace
// must hold (tokens − 1) rows of k distinct experts in [0, n_experts) per MoE layer;
// `required`: every sample must have one (routing replay in RL).
at::Tensor packed_routing(const std::vector<Sample>& samples, const std::vector<int64_t>& which,
                          const ModelConfig& cfg, const at::Device& device, bool required) {
  const int64_t L = cfg.n_moe_layers(), k = cfg.n_experts_per_tok, width = L * k;
  int64_t T = 0;
  for (int64_t i : which) T += static_cast<int64_t>(samples[i].tokens.size());
  at::Tensor out = at::full({T, L, k}, -1, at::kLong);
  int64_t row = 0;
  for (int64_t i : which) {
    const Sample& s = samples[i];
    const int64_t rows = static_cast<int64_t>(s.routing.size()) / width;
    SLIMPI_CHECK((s.routing.empty() && !required) || (int64_t(s.routing.size()) == rows * width &&
                                                       rows == int64_t(s.tokens.size()) - 1),
                 "sample (step {}, group {}, index {}): a routing trace of {} expert ids for {} tokens; this model "
                 "needs (tokens - 1) x {} MoE layers x top-{} (train.routing_replay replays them)",
                 s.step, s.group_index, s.index, s.routing.size(), s.tokens.size(), L, k);
    for (size_t j = 0; j < s.routing.size(); j += size_t(k))  // k distinct experts in range per token and layer
      for (int64_t a = 0; a < k; ++a) {
        const int16_t e = s.routing[j + size_t(a)];
        SLIMPI_CHECK(e >= 0 && e < cfg.n_experts, "sample (step {}, group {}, index {}): routing trace names expert "
                     "{}; the model has {}", s.step, s.group_index, s.index, e, cfg.n_experts);
        for (int64_t b = 0; b < a; ++b)
          SLIMPI_CHECK(s.routing[j + size_t(b)] != e, "sample (step {}, group {}, index {}): routing trace names "
                       "expert {} twice for one token", s.step, s.group_index, s.index, e);
      }
    if (rows > 0)
      out.narrow(0, row, rows).copy_(at::tensor(std::vector<int64_t>(s.routing.begin(), s.routing.end()), at::kLong)
                                         .view({rows, L, k}));
    row += static_cast<int64_t>(s.tokens.size());
  }
  return out.to(device);
}

at::Tensor packed_logits(const Transformer& model, const PackedBatch& b, Precision precision,
                         MoeTrace* moe = nullptr) {
  ForwardPrecision scope(precision, model.device());
  return model.forward_packed(b.tokens, b.seq_lens, moe);
}

// Concatenates a per-token field of the micro-batch's samples: [N].
template <class Field>
at::Tensor gather_field(const std::vector<Sample>& samples, const std::vector<int64_t>& which, Field field,
                        float fill, const at::Device& device) {
  std::vector<at::Tensor> parts;
  for (int64_t i : which) parts.push_back(as_tensor(field(samples[i]), samples[i].response_length(), fill, device));
  return at::cat(parts);
}

// Sums of weighted per-token metrics over the step (this rank), reduced later. Tensor
// terms accumulate where they live (on a GPU: no host round trip per micro-batch);
// reduce() brings them to the host in one copy.
class MetricSums {
 public:
  void add(const std::string& name, const at::Tensor& per_token, const at::Tensor& weight) {
    add_tensor(name, (per_token.detach().to(at::kDouble) * weight.detach().to(at::kDouble)).sum());
  }
  // A 0-dim tensor term (e.g. the loss), detached.
  void add_tensor(const std::string& name, const at::Tensor& value) {
    at::Tensor v = value.detach().to(at::kDouble);
    auto it = tensor_sums_.find(name);
    if (it == tensor_sums_.end()) tensor_sums_.emplace(name, v);
    else it->second = it->second + v;
  }
  void add_value(const std::string& name, double v) { sums_[name] += v; }
  // Sums over dp ranks; returns name -> value. Every rank must hold the same names
  // (declare them with add_value(name, 0)).
  std::map<std::string, double> reduce(Comm* dp) {
    if (!tensor_sums_.empty()) {
      std::vector<at::Tensor> parts;
      for (const auto& [k, v] : tensor_sums_) parts.push_back(v.reshape({1}));
      const at::Tensor host = at::cat(parts).cpu();  // [n] f64, one copy
      int64_t i = 0;
      for (const auto& [k, v] : tensor_sums_) sums_[k] += host.data_ptr<double>()[i++];
      tensor_sums_.clear();
    }
    std::vector<double> values;
    for (const auto& [k, v] : sums_) values.push_back(v);
    at::Tensor t = at::tensor(values, at::kDouble);
    if (dp) allreduce(*dp, t);
    std::map<std::string, double> out;
    int64_t i = 0;
    for (const auto& [k, v] : sums_) out[k] = t.data_ptr<double>()[i++];
    return out;
  }

 private:
  std::map<std::string, double> sums_;
  std::map<std::string, at::Tensor> tensor_sums_;  // 0-dim f64, on the model's device
};

// Sum of a sample's loss mask (all ones when it has none): host data, no device sync.
double mask_sum(const Sample& s) {
  if (s.loss_mask.empty()) return static_cast<double>(s.response_length());
  double sum = 0;
  for (float m : s.loss_mask) sum += m;
  return sum;
}

}  // namespace

TrainerConfig TrainerConfig::from_deck(const Deck& deck) {
  TrainerConfig c;
  c.mode = deck.get_string("train.mode");
  c.advantage_estimator = deck.get_string("train.advantage_estimator");
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
  if (c.routing_replay && c.mode != "rl")
    SLIMPI_FAIL_ALL("train.routing_replay ({}) replays the experts the rollout engine chose; train.mode = \"{}\" ({}) "
                    "has no rollouts",
                    deck.source("train.routing_replay"), c.mode, deck.source("train.mode"));
  if (c.routing_replay && deck.get_int("model.n_experts") == 0)
    SLIMPI_FAIL_ALL("train.routing_replay ({}) replays the experts of a mixture-of-experts policy, but model.n_experts "
                    "= 0 ({})",
                    deck.source("train.routing_replay"), deck.source("model.n_experts"));
  c.routing_replay_gap = deck.get_bool("train.routing_replay_gap");
  if (c.routing_replay_gap && !c.routing_replay)
    SLIMPI_FAIL_ALL("train.routing_replay_gap ({}) measures what routing replay changes; train.routing_replay = false ({})",
                    deck.source("train.routing_replay_gap"), deck.source("train.routing_replay"));
  c.moe_aux_loss_coef = deck.get_float("train.moe_aux_loss_coef");
  c.moe_z_loss_coef = deck.get_float("train.moe_z_loss_coef");
  if (deck.get_int("model.n_experts") == 0)
    for (const char* k : {"train.moe_aux_loss_coef", "train.moe_z_loss_coef"})
      if (!deck.has_default_value(k))
        SLIMPI_FAIL_ALL("{} ({}) weighs a mixture-of-experts router loss, but model.n_experts = 0 ({})", k,
                        deck.source(k), deck.source("model.n_experts"));
  c.use_tis = deck.get_bool("train.use_tis");
  c.mismatch = MismatchConfig::from_deck(deck);
  if (!c.use_tis && !deck.has_default_value("train.tis_function"))
    SLIMPI_FAIL_ALL("train.tis_function ({}) is the correction of train.use_tis, which is false ({})",
                    deck.source("train.tis_function"), deck.source("train.use_tis"));
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
  if (c.eps_clip_c != 0.0 && c.eps_clip_c <= 1.0)
    SLIMPI_FAIL_ALL("train.eps_clip_c = {} ({}): the dual clip needs c > 1 (or 0 for off)", c.eps_clip_c,
                    deck.source("train.eps_clip_c"));
  // slime's rules (its arguments.py asserts both) and AdamW's ranges.
  if (c.kl_coef != 0.0 && c.kl_loss_coef != 0.0)
    SLIMPI_FAIL_ALL("train.kl_coef = {} ({}) and train.kl_loss_coef = {} ({}) are both non-zero: use the reward-side "
                    "KL or the KL loss, not both (as slime)",
                    c.kl_coef, deck.source("train.kl_coef"), c.kl_loss_coef, deck.source("train.kl_loss_coef"));
  const bool reinforce = c.advantage_estimator.rfind("reinforce_plus_plus", 0) == 0;
  if (c.mode == "rl" && reinforce && !c.normalize_advantages)
    SLIMPI_FAIL_ALL("train.advantage_estimator = \"{}\" ({}) needs train.normalize_advantages = true ({}), as in slime",
                    c.advantage_estimator, deck.source("train.advantage_estimator"),
                    deck.source("train.normalize_advantages"));
  if (c.kl_coef != 0.0 && !reinforce)
    SLIMPI_FAIL_ALL("train.kl_coef = {} ({}) acts only on the reinforce_plus_plus estimators; "
                    "train.advantage_estimator = \"{}\" ({}) would ignore it (use train.kl_loss_coef)",
                    c.kl_coef, deck.source("train.kl_coef"), c.advantage_estimator,
                    deck.source("train.advantage_estimator"));
  if (!c.use_kl_loss && c.kl_loss_coef != 0.0 && c.mode == "rl")
    SLIMPI_FAIL_ALL("train.kl_loss_coef = {} ({}) would be ignored: train.use_kl_loss = false ({})", c.kl_loss_coef,
                    deck.source("train.kl_loss_coef"), deck.source("train.use_kl_loss"));
  if (c.adam.beta1 >= 1.0 || c.adam.beta2 >= 1.0)
    SLIMPI_FAIL_ALL("train.adam_beta1 = {} ({}) and train.adam_beta2 = {} ({}) must each be in [0, 1)", c.adam.beta1,
                    deck.source("train.adam_beta1"), c.adam.beta2, deck.source("train.adam_beta2"));
  if (c.adam.eps <= 0.0)
    SLIMPI_FAIL_ALL("train.adam_eps = {} ({}) must be > 0", c.adam.eps, deck.source("train.adam_eps"));
  return c;
}

namespace {

// The parameters of one gradient buffer: the replicated ones, or the experts of a shard.
std::vector<NamedTensor> gradient_group(const Transformer& policy, bool experts) {
  const bool sharded = policy.expert_shard().size > 1;
  std::vector<NamedTensor> out;
  for (const auto& p : policy.parameters())
    if ((sharded && Transformer::is_expert_parameter(p.name)) == experts) out.push_back(p);
  return out;
}

// A one-token forward for a rank with no micro-batch left while its expert group still
// runs some: it meets the others' token exchanges and contributes nothing.
at::Tensor idle_forward(const Transformer& model, Precision precision) {
  ForwardPrecision scope(precision, model.device());
  const at::Tensor token = at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(model.device()));
  return model.forward_packed(token, {1}).sum() * 0.0;
}

}  // namespace

Trainer::Trainer(const TrainerConfig& cfg, Transformer& policy, Comm* dp, const Transformer* reference,
                 Comm* expert_replicas)
    : cfg_(cfg),
      policy_(policy),
      dp_(dp),
      reference_(reference),
      expert_group_(policy.expert_shard().size > 1 ? policy.expert_shard().comm : nullptr),
      expert_replicas_(expert_replicas),
      optimizer_(policy.parameters(), cfg.adam),
      grads_(gradient_group(policy, false), cfg.grad_bucket_bytes) {
  SLIMPI_CHECK(!(needs_reference(cfg_) && !reference_), "the KL loss and the reward-side KL need a reference model");
  if (expert_group_) {
    SLIMPI_CHECK(!reference_ || reference_->expert_shard().comm == expert_group_,
                 "the reference model must be sharded over the policy's expert group");
    expert_grads_ = std::make_unique<GradBuffer>(gradient_group(policy, true), cfg.grad_bucket_bytes);
  }
}

int64_t Trainer::aligned_micro_batches(int64_t n) const {
  if (!expert_group_) return n;
  at::Tensor t = at::full({1}, n, at::kLong);
  allreduce(*expert_group_, t, ReduceOp::Max);
  return t.item<int64_t>();
}

double Trainer::global_grad_norm() const {
  const double dense = grads_.global_norm();
  if (!expert_grads_) return dense;
  // The group's shards hold different experts; the replicas of a shard hold the same sums.
  const double mine = expert_grads_->global_norm();
  at::Tensor sq = at::full({1}, mine * mine, at::kDouble);
  allreduce(*expert_group_, sq);
  return std::sqrt(dense * dense + sq.item<double>());
}

bool Trainer::needs_reference(const TrainerConfig& cfg) {
  return cfg.mode == "rl" && (cfg.use_kl_loss || cfg.kl_coef != 0.0);
}

void Trainer::compute_log_probs(std::vector<Sample>& samples, bool reference) const {
  SLIMPI_CHECK(!reference || reference_, "no reference model");
  std::vector<std::vector<float>> logp = response_log_probs(samples, reference ? *reference_ : policy_,
                                                            cfg_.routing_replay);
  for (size_t i = 0; i < samples.size(); ++i)
    (reference ? samples[i].ref_log_probs : samples[i].old_log_probs) = std::move(logp[i]);
}

std::vector<std::vector<float>> Trainer::response_log_probs(const std::vector<Sample>& samples,
                                                            const Transformer& model, bool replay) const {
  at::NoGradGuard no_grad;
  std::vector<int64_t> lengths;
  for (const auto& s : samples) lengths.push_back(static_cast<int64_t>(s.tokens.size()));
  const auto plan = plan_micro_batches(lengths, cfg_.n_micro_batches, cfg_.max_tokens_per_micro_batch);
  for (int64_t i = int64_t(plan.size()), n = aligned_micro_batches(i); i < n; ++i)
    idle_forward(model, cfg_.precision);  // expert parallelism: meet the group's exchanges
  std::vector<std::vector<float>> out(samples.size());
  for (const auto& which : plan) {
    PackedBatch b = pack(samples, which, model.device());
    MoeTrace trace;  // train.routing_replay: the rollout's experts in every trainer forward
    if (replay) trace.replay = packed_routing(samples, which, model.config(), model.device(), true);
    const at::Tensor logits = packed_logits(model, b, cfg_.precision, replay ? &trace : nullptr);
    at::Tensor logp = score_tokens(logits, response_positions(b.tokens, b.seq_lens, b.prompt_lens),
                                   cfg_.temperature, false, b.support).logp.cpu().contiguous();
    int64_t start = 0;
    for (int64_t i : which) {
      const int64_t n = samples[i].response_length();
      const float* p = logp.data_ptr<float>() + start;
      out[size_t(i)].assign(p, p + n);
      start += n;
    }
  }
  return out;
}

std::map<std::string, double> Trainer::prepare_rollout(std::vector<Sample>& local, bool recompute_old) {
  SLIMPI_CHECK(cfg_.mode == "rl", "prepare_rollout is for RL rollouts");
  const bool with_old = recompute_old || cfg_.kl_coef != 0.0;
  if (reference_) compute_log_probs(local, /*reference=*/true);
  if (with_old) compute_log_probs(local, /*reference=*/false);
  std::vector<at::Tensor> advantages, masks, per_sample;  // [R_i] each; per_sample: m / Σm (a sample's token mean)
  // The metric names depend on the configuration only, so that every dp rank reduces
  // the same list, whatever samples it holds.
  MetricSums sums;
  sums.add_value("rollout/advantages", 0.0);
  if (with_old) sums.add_value("rollout/log_probs", 0.0);
  if (reference_) sums.add_value("rollout/ref_log_probs", 0.0);
  if (reference_ && with_old) sums.add_value("rollout/kl", 0.0);
  // train.routing_replay_gap: the rollout's log-probs under the weights that start it,
  // without replay, against the engine's: what the replayed old log-probs are compared
  // with in train/train_rollout_logprob_abs_diff, weighted as the loss weighs tokens.
  std::vector<std::vector<float>> unreplayed;
  if (cfg_.routing_replay_gap) {
    unreplayed = response_log_probs(local, policy_, /*replay=*/false);
    sums.add_value("train/train_rollout_logprob_abs_diff_unreplayed", 0.0);
    sums.add_value("gap/weight", 0.0);
  }
  for (Sample& s : local) {
    const int64_t R = s.response_length();
    at::Tensor mask = as_tensor(s.loss_mask, R, 1.0f, at::kCPU);  // [R]
    masks.push_back(mask);
    per_sample.push_back(mask / std::max(mask_sum(s), 1.0));
    AdvantageInputs in;
    in.reward = s.reward;
    in.mask = mask;
    in.kl_coef = cfg_.kl_coef;
    in.gamma = cfg_.gamma;
    if (!s.ref_log_probs.empty() && !s.old_log_probs.empty()) {
      at::Tensor kl = kl_estimate(at::tensor(s.old_log_probs), at::tensor(s.ref_log_probs), cfg_.kl_loss_type);
      s.kl.assign(kl.data_ptr<float>(), kl.data_ptr<float>() + R);
      if (cfg_.kl_coef != 0.0) in.kl = kl;  // slime: the KL enters the returns only when kl_coef != 0
      if (reference_ && with_old) sums.add("rollout/kl", kl, per_sample.back());
    }
    at::Tensor adv = compute_advantages(cfg_.advantage_estimator, in).to(at::kFloat).contiguous();  // [R]
    s.raw_advantages.assign(adv.data_ptr<float>(), adv.data_ptr<float>() + R);
    advantages.push_back(adv);  // whitening replaces the tensors; raw_advantages keeps a copy
    if (with_old) sums.add("rollout/log_probs", at::tensor(s.old_log_probs), per_sample.back());
    if (!unreplayed.empty() && !s.rollout_log_probs.empty()) {
      const at::Tensor w = cfg_.calculate_per_token_loss ? mask : per_sample.back();  // [R]
      const at::Tensor gap = (at::tensor(unreplayed[&s - local.data()]) - at::tensor(s.rollout_log_probs)).abs();
      sums.add("train/train_rollout_logprob_abs_diff_unreplayed", gap, w);
      sums.add_value("gap/weight", w.sum().item<double>());
    }
    if (reference_) sums.add("rollout/ref_log_probs", at::tensor(s.ref_log_probs), per_sample.back());
  }
  // Whitening: once per rollout, over every sample of it on every dp rank (slime).
  if (cfg_.normalize_advantages) whiten_advantages(advantages, masks, dp_);
  for (size_t i = 0; i < local.size(); ++i) {
    at::Tensor a = advantages[i].contiguous();
    local[i].advantages.assign(a.data_ptr<float>(), a.data_ptr<float>() + a.numel());
    sums.add("rollout/advantages", a, per_sample[i]);
  }
  sums.add_value("rollout/n_samples", double(local.size()));
  std::map<std::string, double> totals = sums.reduce(dp_);
  const double n = std::max(totals["rollout/n_samples"], 1.0);
  std::map<std::string, double> metrics;
  for (const auto& [k, v] : totals)
    if (k.rfind("rollout/", 0) == 0 && k != "rollout/n_samples") metrics[k] = v / n;
  if (totals.count("gap/weight") && totals["gap/weight"] > 0)
    metrics["train/train_rollout_logprob_abs_diff_unreplayed"] =
        totals["train/train_rollout_logprob_abs_diff_unreplayed"] / totals["gap/weight"];
  return metrics;
}

std::map<std::string, double> Trainer::train_step(std::vector<Sample>& local) {
  Stopwatch clock;
  const at::Device device = policy_.device();
  const bool rl = cfg_.mode == "rl";

  // Step-wide counts: the reducer's denominators (every rank the same).
  std::vector<at::Tensor> masks, advantages;
  std::vector<double> local_counts{0, 0, 0};  // samples, masked tokens, all tokens
  for (const auto& s : local) {
    masks.push_back(as_tensor(s.loss_mask, s.response_length(), 1.0f, device));
    if (rl) advantages.push_back(as_tensor(s.advantages, s.response_length(), 0.0f, device));
    local_counts[0] += 1;
    local_counts[1] += mask_sum(s);
    local_counts[2] += static_cast<double>(s.tokens.size());
  }
  at::Tensor counts = at::tensor(local_counts, at::kDouble);  // [3]
  if (dp_) allreduce(*dp_, counts);
  const double* totals = counts.data_ptr<double>();
  const double n_samples = totals[0], n_masked = totals[1], n_tokens = totals[2];
  // An optimizer step whose share is empty on every rank (a rollout of very few
  // samples cut into num_steps_per_rollout parts rank by rank) changes nothing.
  if (n_samples == 0) return {{"train/optimizer_step_empty", 1.0}};

  grads_.zero();
  if (expert_grads_) expert_grads_->zero();
  // Every metric a step can log, declared up front: the list reduced over dp must be
  // the same on every rank, including a rank that holds no sample this step.
  MetricSums sums;
  for (const char* k : {"train/loss", "train/entropy_loss"}) sums.add_value(k, 0.0);
  const ModelConfig& mc = policy_.config();
  const bool moe = mc.n_experts > 0;
  std::vector<int64_t> moe_layers;  // model layer of each MoE layer
  for (int64_t l = 0; l < mc.n_layers; ++l)
    if (mc.is_moe_layer(l)) moe_layers.push_back(l);
  if (moe) {
    for (const char* k : {"train/moe_aux_loss", "train/moe_z_loss"}) sums.add_value(k, 0.0);
    for (int64_t l : moe_layers) {
      sums.add_value(fmt::format("train/routing_matches/layer_{}", l), 0.0);
      sums.add_value(fmt::format("train/routing_positions/layer_{}", l), 0.0);
    }
  }
  if (rl) {
    for (const char* k : {"train/pg_loss", "train/pg_clipfrac", "train/ppo_kl", "train/train_rollout_logprob_abs_diff"})
      sums.add_value(k, 0.0);
    if (cfg_.use_tis) {
      for (const std::string& k : mismatch_metric_names(cfg_.mismatch)) sums.add_value("train/" + k, 0.0);
      sums.add_value("train/ois", 0.0);
    }
    if (cfg_.use_kl_loss) sums.add_value("train/kl_loss", 0.0);
  }
  std::vector<int64_t> lengths;
  for (const auto& s : local) lengths.push_back(static_cast<int64_t>(s.tokens.size()));
  // The same on every rank: non-blocking and blocking collectives do not match.
  // With expert parallelism on NCCL, backward itself waits on other ranks (each token
  // exchange synchronises the stream), so a reduction enqueued mid-backward could wait
  // on a replica that waits on this rank: there the reductions follow backward (not
  // yet run on a GPU; on the CPU, MPI's non-blocking reductions never block backward).
  const bool overlap = cfg_.overlap_grad_reduce && dp_ && (device.is_cpu() || dp_->device_memory()) &&
                       !(expert_group_ && dp_->device_memory());
  const auto plan = plan_micro_batches(lengths, cfg_.n_micro_batches, cfg_.max_tokens_per_micro_batch);
  // The last backward of the step reduces gradient buckets as it produces them. With
  // MPI that needs the hooks on this thread (CPU autograd runs here; CUDA autograd
  // runs in its own threads, where only NCCL may be called).
  auto arm = [&] {
    grads_.start_overlapped_reduction(dp_);
    if (expert_grads_) expert_grads_->start_overlapped_reduction(expert_replicas_);
  };
  const int64_t n_runs = aligned_micro_batches(int64_t(plan.size()));
  for (int64_t micro = 0; micro < n_runs; ++micro) {
    if (micro >= int64_t(plan.size())) {  // expert parallelism: the group still runs micro-batches
      // The forwards and backward of a real micro-batch, in its order: the token
      // exchanges of the group's ranks pair up by call order.
      at::Tensor idle_loss = idle_forward(policy_, cfg_.precision);
      if (micro + 1 == n_runs && overlap) arm();
      idle_loss.backward();
      continue;
    }
    const std::vector<int64_t>& which = plan[micro];
    PackedBatch b = pack(local, which, device);
    MoeTrace trace;
    at::Tensor rollout_routing;  // [T, L, k] the engine's experts, -1 where none
    if (moe) rollout_routing = packed_routing(local, which, mc, device, cfg_.routing_replay);
    if (cfg_.routing_replay) trace.replay = rollout_routing;
    const at::Tensor logits = packed_logits(policy_, b, cfg_.precision, moe ? &trace : nullptr);  // [T, V] fp32
    if (moe) {
      // Routing agreement: token-layer positions where the trainer's router picks the
      // same set of experts the engine ran (before any replay).
      const at::Tensor valid = rollout_routing.select(2, 0) >= 0;  // [T, L]
      const at::Tensor same =
          std::get<0>(trace.routed.sort(-1)).eq(std::get<0>(rollout_routing.sort(-1))).all(-1) & valid;
      const at::Tensor per_layer_same = same.sum(0).to(at::kDouble), per_layer_valid = valid.sum(0).to(at::kDouble);
      for (size_t j = 0; j < moe_layers.size(); ++j) {
        sums.add_tensor(fmt::format("train/routing_matches/layer_{}", moe_layers[j]), per_layer_same[j]);
        sums.add_tensor(fmt::format("train/routing_positions/layer_{}", moe_layers[j]), per_layer_valid[j]);
      }
    }
    const ScoredPositions positions = response_positions(b.tokens, b.seq_lens, b.prompt_lens);
    TokenLogProbs lp = score_tokens(logits, positions, cfg_.temperature, /*with_entropy=*/true, b.support);
    // Reducer weights [N]: m / (D_i · n_samples) per rollout, or m / n_masked per token.
    std::vector<at::Tensor> mask_parts, adv_parts;
    std::vector<double> denominators;
    for (int64_t i : which) {
      mask_parts.push_back(masks[i]);
      if (rl) adv_parts.push_back(advantages[i]);
      denominators.push_back(std::max(mask_sum(local[i]), 1.0));
    }
    at::Tensor mask = at::cat(mask_parts);
    at::Tensor weight = cfg_.calculate_per_token_loss
                            ? mask / n_masked
                            : mask / (at::tensor(denominators, at::kDouble).to(device).to(at::kFloat)
                                          .index_select(0, b.sample_of_token) * n_samples);

    at::Tensor loss;
    if (!rl) {
      at::Tensor nll = -lp.logp;
      loss = (nll * weight).sum();
      sums.add("train/loss", nll, weight);
    } else {
      at::Tensor adv = at::cat(adv_parts);
      at::Tensor old = gather_field(local, which, [](const Sample& s) { return s.old_log_probs; }, 0.0f, device);
      bool have_old = true;
      for (int64_t i : which) have_old = have_old && !local[i].old_log_probs.empty();
      if (!have_old) {  // one step per rollout: this forward's policy is the old one (ρ = 1)
        old = lp.logp.detach();
        at::Tensor captured = old.cpu().contiguous();
        int64_t start = 0;
        for (int64_t i : which) {
          const float* p = captured.data_ptr<float>() + start;
          local[i].old_log_probs.assign(p, p + local[i].response_length());
          start += local[i].response_length();
        }
      }
      const PolicyLoss& policy_loss =
          policy_losses().get(advantage_estimators().get(cfg_.advantage_estimator).policy_loss);
      PolicyLossTerms pg = policy_loss({lp.logp, old, adv, b.sample_of_token, int64_t(which.size()), cfg_.eps_clip,
                                        cfg_.eps_clip_high, cfg_.eps_clip_c});
      at::Tensor pg_tokens = pg.loss;
      const bool have_rollout = !local[which[0]].rollout_log_probs.empty();
      at::Tensor rollout_logp;
      if (have_rollout)
        rollout_logp =
            gather_field(local, which, [](const Sample& s) { return s.rollout_log_probs; }, 0.0f, device);
      // Off-policy correction against the engine's log-probs. Its metrics reduce with the
      // step's weights; tokens it rejects (MIS) leave the numerators of every loss term.
      if (cfg_.use_tis) {
        SLIMPI_CHECK(have_rollout, "train.use_tis needs the rollout log-probs of every sample");
        MismatchCorrection c =
            mismatch_correction(old, rollout_logp, mask, b.sample_of_token, int64_t(which.size()), cfg_.mismatch);
        pg_tokens = pg_tokens * c.weight;
        for (const auto& [name, values] : c.metrics) sums.add("train/" + name, values, weight);
        sums.add("train/ois", at::exp(-pg.ppo_kl), weight);
        if (c.keep.defined()) weight = weight * c.keep;
      }
      if (have_rollout)  // slime compares the old log-probs (the current ones at a rollout's first step)
        sums.add("train/train_rollout_logprob_abs_diff", (old - rollout_logp).abs(), weight);
      at::Tensor pg_loss = (pg_tokens * weight).sum();
      at::Tensor entropy_loss = (lp.entropy * weight).sum();
      loss = pg_loss - cfg_.entropy_coef * entropy_loss;
      sums.add("train/pg_loss", pg_tokens, weight);
      sums.add("train/pg_clipfrac", pg.clipfrac, weight);
      sums.add("train/ppo_kl", pg.ppo_kl, weight);
      if (cfg_.use_kl_loss) {
        at::Tensor ref = gather_field(local, which, [](const Sample& s) { return s.ref_log_probs; }, 0.0f, device);
        at::Tensor kl = kl_estimate(lp.logp, ref, cfg_.kl_loss_type);
        loss = loss + cfg_.kl_loss_coef * (kl * weight).sum();
        sums.add("train/kl_loss", kl, weight);
      }
      sums.add_tensor("train/loss", loss);
    }
    sums.add("train/entropy_loss", lp.entropy, weight);
    if (moe) {
      // The routers' auxiliary losses of this micro-batch, weighted by its share of the
      // step's tokens (over all ranks): the step's loss is their token-weighted mean.
      const double share = double(b.tokens.size(0)) / n_tokens;
      const at::Tensor aux = moe_load_balancing_loss(trace.router_logits, mc.n_experts_per_tok);
      const at::Tensor z = moe_router_z_loss(trace.router_logits);
      if (cfg_.moe_aux_loss_coef > 0) loss = loss + share * cfg_.moe_aux_loss_coef * aux;
      if (cfg_.moe_z_loss_coef > 0) loss = loss + share * cfg_.moe_z_loss_coef * z;
      sums.add_tensor("train/moe_aux_loss", aux * share);
      sums.add_tensor("train/moe_z_loss", z * share);
    }
    if (micro + 1 == n_runs && overlap) arm();
    loss.backward();
  }
  SLIMPI_CHECK(grads_.grads_alias_buffer() && (!expert_grads_ || expert_grads_->grads_alias_buffer()),
               "autograd replaced a gradient outside the flat gradient buffer");

  if (overlap && !grads_.reduction_armed()) arm();  // a rank with no micro-batch
  grads_.all_reduce(dp_);
  if (expert_grads_) expert_grads_->all_reduce(expert_replicas_);
  const double grad_norm = global_grad_norm();
  std::map<std::string, double> metrics = sums.reduce(dp_);
  if (moe) {  // per-layer counts over every rank -> shares, and all layers' (none when no sample had a trace)
    double all_matches = 0, all_positions = 0;
    for (int64_t l : moe_layers) {
      const std::string matches = fmt::format("train/routing_matches/layer_{}", l);
      const std::string positions = fmt::format("train/routing_positions/layer_{}", l);
      all_matches += metrics[matches];
      all_positions += metrics[positions];
      if (metrics[positions] > 0)
        metrics[fmt::format("train/routing_agreement_by_layer/{}", l)] = metrics[matches] / metrics[positions];
      metrics.erase(matches);
      metrics.erase(positions);
    }
    if (all_positions > 0) metrics["train/routing_agreement"] = all_matches / all_positions;
  }
  const double lr = cfg_.lr.at(optimizer_.n_steps());
  // Megatron's check for NaN in loss and gradients: a non-finite step never reaches the
  // weights. Loss and norm are reduced values, the same on every dp rank.
  const double loss = metrics.count("train/loss") ? metrics["train/loss"] : 0.0;
  const bool finite = std::isfinite(grad_norm) && std::isfinite(loss);
  if (finite) {
    grads_.clip(grad_norm, cfg_.clip_grad);
    if (expert_grads_) expert_grads_->clip(grad_norm, cfg_.clip_grad);
    optimizer_.step(lr);
  } else if (!cfg_.skip_nonfinite_steps) {
    SLIMPI_FAIL_ALL("optimizer step {}: the loss is {} and the gradient norm {}; stopping before they reach the "
                    "weights (train.skip_nonfinite_steps = true skips such steps instead)",
                    optimizer_.n_steps(), loss, grad_norm);
  }
  metrics["train/skipped_nonfinite_step"] = finite ? 0.0 : 1.0;
  metrics["train/grad_norm"] = grad_norm;
  metrics["train/lr"] = lr;
  const double seconds = clock.seconds();
  metrics["perf/actor_train_time"] = seconds;
  metrics["perf/train_tokens_per_s"] = n_tokens / seconds;
  return metrics;
}

void Trainer::save(const std::string& path) const {
  // Expert parallelism: the whole model's tensors, the group's experts gathered first
  // (a collective of the group, before anything that could fail on one rank alone).
  auto whole = [&](const std::vector<NamedTensor>& local) {
    if (!expert_group_) return local;
    const ExpertShard& shard = policy_.expert_shard();
    std::vector<NamedTensor> out, experts;
    for (const auto& t : local) (Transformer::is_expert_parameter(t.name) ? experts : out).push_back(t);
    for (auto& t : gather_expert_tensors(shard, shard.count(policy_.config().n_experts), experts, /*to_all=*/false))
      out.push_back(t);
    return out;
  };
  const std::vector<NamedTensor> params = whole(policy_.parameters());
  const std::vector<NamedTensor> state = whole(optimizer_.state());
  if (expert_group_ && expert_group_->rank() != 0) return;
  // A checkpoint is never written with non-finite numbers in it.
  for (const auto* list : {&params, &state})
    for (const NamedTensor& t : *list)
      SLIMPI_CHECK(at::isfinite(t.tensor).all().item<bool>(),
                   "refusing to write {}: tensor {} holds NaN or inf values", path, t.name);
  h5::File f = h5::File::create(path, MPI_COMM_NULL);
  h5::Handle model = h5::create_group(f.id(), "model");
  write_tensors(model.id(), params);
  h5::Handle opt = h5::create_group(f.id(), "optimizer");
  write_tensors(opt.id(), state);
  h5::write_attr(opt.id(), "n_steps", optimizer_.n_steps());
  h5::Handle rng = h5::create_group(f.id(), "rng");
  write_tensor(rng.id(), "torch_cpu", at::detail::getDefaultCPUGenerator().get_state());
  rng.reset();
  opt.reset();
  model.reset();
  f.close();  // throws when the data did not all reach the file
}

void Trainer::load(const std::string& path) {
  load_model_weights(policy_.parameters(), path, "model", expert_group_ != nullptr);
  h5::File f = h5::File::open(path, false, MPI_COMM_NULL);
  h5::Handle opt = h5::open_group(f.id(), "optimizer");
  optimizer_.load_state(h5::read_attr_int(opt.id(), "n_steps"), read_tensors_like(opt.id(), optimizer_.state()));
  h5::Handle rng = h5::open_group(f.id(), "rng");
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(read_tensor(rng.id(), "torch_cpu"));
}

}  // namespace slimpi
