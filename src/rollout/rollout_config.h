// The [rollout] table as the engine and the router want it.
#pragma once

#include "env/env_config.h"
#include "rollout/engine.h"
#include "rollout/request.h"
#include "tokenizer/chat_template.h"

namespace slimpi {

struct ModelConfig;

class Deck;

struct RolloutConfig {
  EngineConfig engine;
  SamplingParams sampling;  // stop_token_ids holds the tokenizer's EOS
  int64_t n_samples_per_prompt = 1;
  bool offload_between_phases = false;  // colocated: free the KV cache while training
  std::shared_ptr<const Tokenizer> tokenizer;  // the run's vocabulary (also in engine.tokenizer)
  ChatFormat chat;                             // data.chat_template and its options
  EnvConfig env;                               // rollout.environment: multi-turn episodes (rollout/episode_runner.h)
  // rollout.prefill_ranks: the last this many engines only prefill, the others decode
  // (rollout/disaggregated_router.h); 0 = every engine does both.
  int64_t prefill_ranks = 0;

  // Reads [rollout]; cross-key errors (a group larger than max_running, a batch token
  // budget below max_running) name the keys.
  // model: the policy's shape (the KV cache's bytes a token, rollout.kv_cache_memory_gb).
  // rollout_weights: kv_cache_dtype's.
  static RolloutConfig from_deck(const Deck& deck, const ModelConfig& model, bool rollout_weights);
};

// rollout.kv_cache_dtype as the engines' cache storage dtype. "auto": the engines' weight
// dtype, which is rollout.precision's where the engines hold rollout weights
// (`rollout_weights`: an RL run, `slimpi generate`) and fp32 where they run the fp32
// policy (an SFT run's evaluation engine).
at::ScalarType kv_cache_dtype(const Deck& deck, bool rollout_weights);

}  // namespace slimpi
