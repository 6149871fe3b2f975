// slimpi::Sample — one response to one prompt, the one sample type of the whole
// pipeline: the engine fills the rollout fields, the router the rewards, the trainers
// the training fields, and rollouts.h5 stores one row of it (src/io/rollout_log.h).
// One wire codec carries it between ranks (src/buffer/sample_codec.h); SFT samples
// are the same type with only tokens and prompt_length set.
//
// Fields follow slime's Sample (docs/rl_loop.md): group_index identifies the
// prompt group in a step, index the sample within its group (0..n_samples_per_prompt).
// Invariants: tokens = prompt + response, prompt_length ≤ tokens.size(); every
// per-response-token vector has R = response_length() entries or is empty (empty
// means: not computed, or for loss_mask all ones, for sampling_support all 0).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace slimpi {

// Stored as int8 in rollouts.h5 (the attribute `status_names` lists them).
enum class SampleStatus : int8_t {
  Pending = 0,    // not generated yet
  Completed = 1,  // stopped on a stop token/string
  Truncated = 2,  // hit max new tokens or the model's context
  Surplus = 3,    // generated, kept by the filter, not used: over-sampling surplus beyond the batch
                  // (4 is not written: rollouts.h5's status_names keeps "4 failed" for old readers)
  Filtered = 5,   // dropped by the dynamic filter (its group's rewards all agree)
  Stale = 6,      // train.async = "full": older than rollout.max_staleness when its turn came
  Baseline = 7,   // train.advantage_estimator = "remax": the greedy response whose reward is its group's baseline
  EnvFailed = 8,  // rollout.environment: the environment failed the episode (crash, hang, bad reply); its group is not trained
};

struct Sample {
  // Identity.
  int64_t step = 0;
  int64_t group_index = 0;
  int64_t index = 0;
  SampleStatus status = SampleStatus::Pending;

  // Tokens.
  std::vector<int64_t> tokens;  // prompt + response token ids
  int64_t prompt_length = 0;

  // Rollout (the engine).
  std::vector<float> rollout_log_probs;   // [R] fp32 from logits / temperature, over the sampling support
  std::vector<int32_t> sampling_support;  // [R] size of the top-k/top-p set the token was drawn from (0: whole vocab)
  std::vector<int64_t> weight_versions;   // [R] weights that produced each token
  // Routing trace of a mixture-of-experts policy: the experts each token ran in every
  // MoE layer, [n_routed × n_moe_layers × k] row-major, for the tokens the engine
  // computed (n_routed = tokens − 1: the last sampled token never ran). Empty: dense model.
  std::vector<int16_t> routing;
  // Speculative decoding (rollout.speculative): tokens drafted for this sample, drafts
  // the policy accepted, and the verify forwards that checked them.
  int32_t spec_drafted = 0, spec_accepted = 0, spec_passes = 0;
  // Multi-turn episodes (rollout.environment): model turns, tool calls parsed from them,
  // seconds spent waiting for the environment and in the whole episode, and the episode's
  // error class (env/environment.h EnvError: 0 none, 1 model, 2 tool, 3 infra, 4 overlong).
  // Single-turn rollouts leave them 0. loss_mask marks the model's tokens (1) apart from
  // the environment's (0).
  int32_t env_turns = 0, env_tool_calls = 0;
  float env_s = 0, episode_s = 0;
  int8_t env_error = 0;
  std::map<std::string, double> env_metrics;  // the replies' `metrics`, summed over the episode
  // A trajectory split into contexts (an observation with new_context: the environment
  // managing the model's context): the response offsets where each later context begins,
  // ascending. The tokens from one to the next are one context the model saw on its own:
  // the new context's tokens (loss mask 0), then its turns and observations. The trainer
  // computes each context as its own sequence (train/packed_batch.h). Empty: one context.
  std::vector<int64_t> context_starts;

  // Reward (the router).
  float raw_reward = 0.0f;  // as the reward style returned it
  float reward = 0.0f;      // after group post-processing (NaN: never post-processed)

  // Training (the trainers, after the old and reference log-probs exist).
  std::vector<float> loss_mask;       // [R] (empty: all ones)
  std::vector<float> old_log_probs;   // [R] the trainer's, before its first optimizer step
  std::vector<float> ref_log_probs;   // [R] the frozen reference's (when one exists)
  std::vector<float> kl;              // [R] reward-side KL estimate (old vs reference; when kl_coef > 0)
  std::vector<float> raw_advantages;  // [R] the estimator's, before whitening
  std::vector<float> advantages;      // [R] as trained (after whitening when it is on)
  std::vector<float> values;          // [R] the critic's, before the rollout's first critic step (ppo)
  std::vector<float> returns;         // [R] the critic's targets, GAE with train.lambd_value (ppo)
  std::vector<float> teacher_log_probs;  // [R] the teacher's, whole vocabulary (on-policy distillation)
  // With train.opd_topk_loss_coef > 0: the teacher's k most likely next tokens at every
  // response position and their probabilities renormalised over them, [R × k] row-major.
  // The trainer's own (made and used in one step): neither sent between ranks nor recorded.
  std::vector<int64_t> teacher_topk_ids;
  std::vector<float> teacher_topk_probs;

  int64_t response_length() const { return static_cast<int64_t>(tokens.size()) - prompt_length; }
  // Tokens the trainer packs for it: one more per later context (train/packed_batch.h).
  int64_t packed_length() const { return static_cast<int64_t>(tokens.size() + context_starts.size()); }
  std::vector<int64_t> prompt() const { return {tokens.begin(), tokens.begin() + prompt_length}; }
  std::vector<int64_t> response() const { return {tokens.begin() + prompt_length, tokens.end()}; }
  // The version of the first response token (0 when none).
  int64_t weight_version() const { return weight_versions.empty() ? 0 : weight_versions.front(); }
};

}  // namespace slimpi
