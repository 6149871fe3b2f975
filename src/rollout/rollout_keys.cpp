// Deck keys of the rollout side (engines, sampling, weight sync):
// declared beside the code that reads them, collected by deck_keys() (cli/deck_keys.cpp).
#include "deck/key_tables.h"

#include "rollout/streaming_router.h"

namespace slimpi {

std::vector<KeySpec> rollout_keys() {
  return {
      // [rollout]
      int_key("rollout.rollout_batch_size", 32, 1, 1e9, "prompts", "prompt groups trained on per step"),
      int_key("rollout.n_samples_per_prompt", 1, 1, 1e6, "samples", "responses generated per prompt (a group)"),
      int_key("rollout.over_sampling_batch_size", 0, 0, 1e9, "prompts",
              "groups generated per round when a dynamic filter drops some (0 = rollout_batch_size)"),
      int_key("rollout.max_sampling_rounds", 8, 1, 1e6, "rounds",
              "generation rounds per step at most while the filter keeps the batch short"),
      choice_key("rollout.speculative", "none", {"none", "mtp"},
                 "speculative decoding: mtp = chains drafted by the policy's first multi-token-prediction depth "
                 "(model.mtp_num_layers > 0), verified by exact rejection sampling (the tokens and log-probs are "
                 "the policy's)"),
      int_key("rollout.spec_num_steps", 3, 1, 8, "tokens", "speculative decoding: tokens drafted per chain"),
      int_key("rollout.spec_num_draft_tokens", 0, 0, 9, "tokens",
              "speculative decoding: tokens per verify pass (SGLang's key; chains only: spec_num_steps + 1, 0 = that)"),
      int_key("rollout.spec_max_running", 0, 0, 1e6, "sequences",
              "speculative decoding: no drafts while more sequences than this run (0: no limit)"),
      int_key("rollout.prefill_ranks", 0, 0, 1e6, "engines",
              "prefill/decode disaggregation: the last this many rollout ranks only prefill prompts (up to their "
              "last token; with rollout.environment, the turns that open an episode's context) and send the KV "
              "rows over MPI to the decode engines (the other rollout ranks), which decode and run the episodes; "
              "0 = every engine does both. Split placement, one-rank engines, no speculative decoding, not with "
              "train.async = \"full\""),
      int_key("rollout.tensor_parallel", 1, 1, 1e6, "ranks",
              "each engine is a group of this many rollout ranks that generate together (heads, MLP columns and "
              "vocabulary rows split as the trainer's; the first rank routes and samples); colocated: 1 or "
              "parallel.tensor_parallel (each tensor group of the trainer an engine running its own shards)"),
      choice_key("rollout.weight_sync_route", "auto", {"auto", "sliced", "broadcast"},
                 "sliced: each engine rank receives only its shard, point to point from the trainer ranks that "
                 "hold it (a plan made once from both layouts); broadcast: the whole model gathered on trainer "
                 "rank 0 and broadcast to every rollout rank, which keeps its slice; auto: sliced for "
                 "tensor-parallel engines, broadcast for one-rank engines"),
      int_key("rollout.weight_sync_bucket_mb", 256, 1, 1e6, "MB", "bucket size of the trainer-to-engine weight sync"),
      choice_key("rollout.weight_sync", "full", {"full", "delta"},
                 "full: every sync sends every weight; delta: the engines keep the last version (trainer rank 0 "
                 "a copy of what it sent: one model in the rollout precision), each bucket "
                 "goes as its changed elements (bitwise, in the rollout precision: indices and values), as its XOR "
                 "with the held copy compressed by zstd, or whole, whichever is smallest, every engine checks the result (XXH3) and a mismatch is sent whole again "
                 "(either route; no-op when colocated)"),
      int_key("rollout.delta_anchor_interval", 10, 1, 1e6, "syncs",
              "rollout.weight_sync = \"delta\": a whole sync (an anchor) every this many; the first sync of a job "
              "is always one"),
      bool_key("rollout.check_weight_update", false, "engines verify a checksum of every weight update"),
      choice_key("rollout.precision", "fp32", {"fp32", "bf16", "fp8"},
                 "rollout engine precision: bf16 = bf16 weights, KV cache and matrix products; the weight "
                 "sync sends bf16 (half the bytes), rounded once from the fp32 masters; fp8 = every linear "
                 "projection's weight in e4m3 with an fp32 scale per 128 x 128 block (DeepSeek-V3's layout), "
                 "quantised from the masters at every sync (those weights at half of bf16's bytes), embeddings, head "
                 "and norms bf16; on the CPU the products run in bf16 on the de-quantised weights (bf16's "
                 "speed and memory), KV cache bf16"),
      float_key("rollout.temperature", 1.0, 0.0, 100.0, "", "sampling temperature (0 = greedy); log-probs use it too"),
      int_key("rollout.top_k", 0, 0, 1e9, "tokens", "sample among the k most likely tokens (0 = off)"),
      float_key("rollout.top_p", 1.0, 0.0, 1.0, "", "nucleus sampling mass (1 = off)"),
      int_key("rollout.max_new_tokens", 64, 1, 1e7, "tokens", "longest response"),
      {"rollout.stop_strings", KeyType::StringList, std::vector<std::string>{}, {}, {}, {}, "",
       "a response ends when it ends with one of these (EOS always ends it)"},
      int_key("rollout.block_size", 16, 1, 4096, "tokens", "tokens per paged KV-cache block"),
      int_key("rollout.kv_cache_tokens", 65536, 1, 1e10, "tokens", "KV-cache capacity per engine"),
      choice_key("rollout.kv_cache_dtype", "auto", {"auto", "bf16", "fp8_e4m3"},
                 "the KV cache's storage: auto = the engine's (fp32 engines fp32; bf16 and fp8 engines bf16); "
                 "fp8_e4m3 = one byte an element, K / scale and V / scale per kv head with the scales fixed at 1 "
                 "(SGLang's default without calibrated scales; magnitudes past 448 saturate), de-quantised as "
                 "attention reads them: twice bf16's tokens in the same rollout.kv_cache_memory_gb"),
      float_key("rollout.kv_cache_memory_gb", 0.0, 0.0, 1e6, "GiB",
                "KV-cache capacity per engine rank in memory (0: rollout.kv_cache_tokens); the tokens it holds are "
                "derived from the model's shape and rollout.precision, and logged"),
      bool_key("rollout.offload_between_phases", false,
               "colocated placement: free each engine's KV cache after the rollout and re-create it at "
               "the next one (training gets the memory back; costs the re-allocation), slime's sleep/wake"),
      int_key("rollout.max_running", 64, 1, 1e6, "sequences", "sequences an engine decodes at once"),
      int_key("rollout.max_batch_tokens", 2048, 1, 1e9, "tokens", "tokens per engine forward (decode + prefill chunks)"),
      bool_key("rollout.prefix_cache", true, "re-use the KV of prompt prefixes seen before (radix cache)"),
      int_key("rollout.chunked_prefill_tokens", 0, 0, 1e9, "tokens",
              "prompt tokens prefilled per engine forward, over all chunks (0 = up to max_batch_tokens); "
              "long prompts are prefilled in chunks between decode steps"),
      int_key("rollout.queue_batches", 2, 1, 1e6, "batches",
              "train.async = full: the generator works this many batches ahead of the trainers at most "
              "(queued groups and groups in flight, in rollout_batch_size units)"),
      int_key("rollout.max_staleness", -1, -1, 1e9, "versions",
              "train.async = full: a group whose oldest token is more weight versions behind the step that "
              "would train it is not trained (rollout.stale_policy); -1 = no bound"),
      choice_key("rollout.stale_policy", "drop", {"drop", "regenerate"},
                 "train.async = full, beyond max_staleness: drop the group (recorded, status 6), or also draw its "
                 "prompt again as a new group"),
      choice_key("rollout.partial", "continue", partial_policies().names(),
                 "train.async = full, sequences in flight when new weights arrive: continue in their engine "
                 "(KV recomputed under the new weights), requeue behind the waiting work (partial response "
                 "kept), or discard their response and start again from the prompt"),
      bool_key("rollout.mask_offpolicy_in_partial", false,
               "train.async = full: tokens of a trained sample older than its newest are left out of the loss "
               "(slime's --mask-offpolicy-in-partial-rollout)"),
      bool_key("rollout.cache_responses", false,
               "with prefix_cache: finished responses enter the radix cache too, so a later prompt that "
               "continues a conversation (prompt + response + more) re-uses their KV")
  };
}

}  // namespace slimpi
