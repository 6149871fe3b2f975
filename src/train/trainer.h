// Trainer — one data-parallel trainer rank: turns a step's samples into one optimizer
// step of the policy (DESIGN.md §2 step 5, math of §3).
//
// Owned by the driver on every trainer rank; holds the AdamW state, the flat gradient
// buffer, the LR schedule and (when the KL loss is on) a frozen reference model.
// A step: global sample/token counts (allreduce) → optional advantage whitening →
// micro-batches (fixed count or first-fit by tokens), each: packed forward, response
// log-probs, per-token loss terms, reduced with step-wide weights, backward → gradient
// all-reduce in buckets → global-norm clip → AdamW. The result does not depend on how
// the step's samples are split over ranks and micro-batches (up to fp32 round-off).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "parallel/comm.h"
#include "train/adamw.h"
#include "train/grad_buffer.h"
#include "train/lr_schedule.h"

namespace slimpi {

class Deck;

struct TrainerConfig {
  std::string mode = "sft";                  // "sft" | "rl"
  std::string advantage_estimator = "grpo";  // picks the policy loss: gspo, cispo, else PPO clip
  double eps_clip = 0.2;
  double eps_clip_high = 0.2;
  double eps_clip_c = 0.0;  // dual clip when > 1
  bool use_kl_loss = false;
  double kl_loss_coef = 0.0;
  std::string kl_loss_type = "low_var_kl";
  double entropy_coef = 0.0;
  bool use_tis = false;
  double tis_clip = 2.0;
  double tis_clip_low = 0.0;
  bool calculate_per_token_loss = false;
  bool normalize_advantages = false;
  double temperature = 1.0;  // log-probs from logits / temperature
  int64_t n_micro_batches = 1;
  int64_t max_tokens_per_micro_batch = 0;  // > 0: dynamic micro-batches
  double clip_grad = 1.0;
  int64_t grad_bucket_bytes = 32 << 20;
  AdamW::Options adam;
  LrSchedule lr;

  static TrainerConfig from_deck(const Deck& deck);
};

// One sample as the trainer sees it. Per-response-token vectors have R = tokens.size()
// − prompt_length entries, or are empty (mask: all ones; old log-probs: the current
// policy's, i.e. ρ = 1; ref/rollout: the term is skipped).
struct TrainSample {
  std::vector<int64_t> tokens;  // prompt + response
  int64_t prompt_length = 1;
  std::vector<float> loss_mask;
  std::vector<float> advantages;  // rl
  std::vector<float> old_log_probs;
  std::vector<float> ref_log_probs;
  std::vector<float> rollout_log_probs;
  int64_t response_length() const { return static_cast<int64_t>(tokens.size()) - prompt_length; }
};

class Trainer {
 public:
  // dp: the data-parallel communicator (null = single rank). reference: frozen
  // reference policy for the KL loss (required when use_kl_loss).
  Trainer(const TrainerConfig& cfg, Transformer& policy, Comm* dp, const Transformer* reference = nullptr);

  // Fills old_log_probs (policy) or ref_log_probs (reference) of `samples`, no grad.
  void compute_log_probs(std::vector<TrainSample>& samples, bool reference) const;

  // One optimizer step on this rank's share of the step. Collective over dp.
  // Returns slime-named metrics (train/*, perf/*), identical on every dp rank.
  std::map<std::string, double> train_step(const std::vector<TrainSample>& local);

  int64_t n_steps() const { return optimizer_.n_steps(); }
  const GradBuffer& grads() const { return grads_; }
  const TrainerConfig& config() const { return cfg_; }

  // Model, optimizer state, step count and the torch CPU RNG state in one HDF5 file
  // (written by the calling rank alone), and back.
  void save(const std::string& path) const;
  void load(const std::string& path);

 private:
  TrainerConfig cfg_;
  Transformer& policy_;
  Comm* dp_;
  const Transformer* reference_;
  AdamW optimizer_;
  GradBuffer grads_;
};

}  // namespace slimpi
