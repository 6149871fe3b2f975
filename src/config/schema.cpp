#include "config/schema.h"

#include <slimpi/error.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>

// The extension points: the schema takes their choices from their registries.
#include "buffer/dynamic_filter.h"
#include "driver/step_schedule.h"
#include "env/environment.h"
#include "reward/reward.h"
#include "train/advantages.h"
#include "tokenizer/chat_template.h"
#include "train/lr_schedule.h"
#include "train/mismatch_correction.h"
#include "rollout/streaming_router.h"
#include "train/policy_loss.h"

namespace slimpi {
namespace {

KeySpec int_key(std::string key, int64_t def, double lo, double hi, std::string unit,
                std::string help) {
  return {std::move(key), KeyType::Int, def, lo, hi, {}, std::move(unit), std::move(help)};
}
KeySpec float_key(std::string key, double def, double lo, double hi, std::string unit,
                  std::string help) {
  return {std::move(key), KeyType::Float, def, lo, hi, {}, std::move(unit), std::move(help)};
}
KeySpec string_key(std::string key, std::string def, std::string help) {
  return {std::move(key), KeyType::String, std::move(def), {}, {}, {}, "", std::move(help)};
}
KeySpec bool_key(std::string key, bool def, std::string help) {
  return {std::move(key), KeyType::Bool, def, {}, {}, {}, "", std::move(help)};
}
KeySpec choice_key(std::string key, std::string def, std::vector<std::string> choices,
                   std::string help) {
  return {std::move(key), KeyType::String, std::move(def), {}, {}, std::move(choices), "",
          std::move(help)};
}

// A registry's names with "auto" first (a key whose "auto" resolves to one of them).
std::vector<std::string> with_auto(std::vector<std::string> names) {
  names.insert(names.begin(), "auto");
  return names;
}

constexpr double kMaxInt = 9.0e15;  // exactly representable in a double

// Every deck key slimpi understands. Later subsystems add their tables here.
std::vector<KeySpec> declare_keys() {
  return {
      // [run]
      string_key("run.name", "slimpi", "name of the run; also the default run directory"),
      string_key("run.dir", "", "run directory for every output file (\"\" = runs/<run.name>)"),
      int_key("run.seed", 1234, 0, kMaxInt, "", "seed of every random stream of the run"),
      int_key("run.n_steps", 1, 0, 1e9, "steps", "number of RL steps (one rollout + training each)"),
      choice_key("run.device", "auto", {"auto", "cpu", "cuda"},
                 "where tensors live; auto takes the rank's GPU when every rank has one"),
      int_key("run.job_steps", 0, 0, 1e9, "steps",
              "steps this job runs at most before it checkpoints and exits 0 (0 = to run.n_steps); for job chains"),
      int_key("run.threads", 0, 0, 1024, "threads",
              "torch/OpenMP threads per rank (0 = cores on the node / ranks on the node)"),
      // [parallel]
      choice_key("parallel.placement", "split", {"split", "colocate"},
                 "split: trainer and rollout ranks apart; colocate: every rank does both"),
      int_key("parallel.trainer_ranks", 0, 0, 1e7, "ranks",
              "trainer ranks in split placement (0 = world size minus rollout_ranks, or half)"),
      int_key("parallel.rollout_ranks", 0, 0, 1e7, "ranks",
              "rollout ranks in split placement (0 = world size minus trainer_ranks)"),
      choice_key("parallel.comm_backend", "auto", {"auto", "mpi", "nccl"},
                 "collective backend; auto = NCCL when every rank has a GPU, else MPI"),
      int_key("parallel.tensor_parallel", 1, 1, 1e6, "ranks",
              "split the trainer's dense layers over groups of this many trainer ranks (Megatron's tensor "
              "parallelism: heads, MLP columns and vocabulary rows; tensor fastest, then expert, then data)"),
      bool_key("parallel.sequence_parallel", false,
               "with tensor parallelism: norms and residuals hold 1/tensor_parallel of the tokens per rank "
               "(Megatron's sequence parallelism)"),
      int_key("parallel.expert_parallel", 1, 1, 1e6, "ranks",
              "MoE: shard each layer's experts over groups of this many trainer ranks (tokens exchanged all-to-all)"),
      float_key("parallel.timeout_s", 600.0, 1.0, 1e7, "s",
                "a blocking collective waiting longer than this aborts the job, naming it"),
      // [model]
      int_key("model.vocab_size", 260, 2, 1e7, "tokens", "vocabulary size (the byte tokenizer needs 259)"),
      int_key("model.hidden_size", 128, 2, 1e6, "", "model width d"),
      int_key("model.n_layers", 4, 1, 1e4, "", "transformer blocks L"),
      int_key("model.n_heads", 4, 1, 1e4, "", "query heads H (hidden_size / n_heads = head dim D unless model.head_dim)"),
      int_key("model.n_kv_heads", 0, 0, 1e4, "", "key/value heads (grouped-query attention; 0 = n_heads)"),
      int_key("model.intermediate_size", 344, 1, 1e7, "", "SwiGLU MLP width"),
      int_key("model.max_seq_len", 512, 2, 1e7, "tokens", "longest prompt + response the model accepts"),
      float_key("model.rope_theta", 10000.0, 1.0, 1e12, "", "RoPE base"),
      float_key("model.rms_norm_eps", 1e-6, 0.0, 1.0, "", "RMSNorm epsilon"),
      float_key("model.init_std", 0.02, 0.0, 10.0, "", "std of the normal initialisation of weights"),
      bool_key("model.tie_word_embeddings", false, "LM head shares the embedding matrix"),
      bool_key("model.qkv_bias", false, "biases on the q/k/v projections (Qwen2; Llama/Qwen3 attention_bias)"),
      bool_key("model.o_bias", false, "bias on the o projection (Llama/Qwen3 attention_bias)"),
      bool_key("model.qk_norm", false, "RMSNorm of each query and key head before RoPE (Qwen3's q_norm/k_norm)"),
      int_key("model.n_experts", 0, 0, 32767, "experts",
              "mixture of experts: routed experts per MoE layer (0 = dense; Qwen3-MoE's num_experts)"),
      int_key("model.n_experts_per_tok", 2, 1, 1e5, "experts", "MoE: experts each token is routed to (top-k)"),
      int_key("model.moe_intermediate_size", 0, 0, 1e9, "", "MoE: each expert's MLP width (0 = intermediate_size)"),
      bool_key("model.norm_topk_prob", true, "MoE: renormalise the top-k router probabilities to sum to 1"),
      int_key("model.shared_expert_intermediate_size", 0, 0, 1e9, "",
              "MoE: width of a shared expert every token runs, behind a sigmoid gate (Qwen2-MoE; 0 = none)"),
      int_key("model.mtp_num_layers", 0, 0, 16, "layers",
              "multi-token prediction depths (DeepSeek-V3's MTP modules, as MiMo ships them): depth i predicts the "
              "token i + 2 ahead; the rollout's speculative draft (rollout.speculative = \"mtp\"); 0 = none"),
      int_key("model.moe_layer_freq", 1, 1, 1e6, "layers",
              "MoE: layer l (from 0) is sparse when (l + 1) % moe_layer_freq == 0 (Qwen3-MoE's decoder_sparse_step)"),
      int_key("model.head_dim", 0, 0, 1e5, "", "head dimension D (0 = hidden_size / n_heads; Qwen3 sets it)"),
      choice_key("model.rope_scaling", "none", {"none", "linear", "llama3"},
                 "RoPE frequency scaling (Hugging Face rope_scaling): linear = every frequency / rope_factor; "
                 "llama3 = Llama 3.1's blend by wavelength"),
      float_key("model.rope_factor", 1.0, 1e-6, 1e6, "", "rope_scaling factor"),
      float_key("model.rope_low_freq_factor", 1.0, 1e-6, 1e6, "", "llama3 rope_scaling: low_freq_factor"),
      float_key("model.rope_high_freq_factor", 4.0, 1e-6, 1e6, "", "llama3 rope_scaling: high_freq_factor"),
      int_key("model.rope_original_max_seq_len", 8192, 1, 1e9, "tokens",
              "llama3 rope_scaling: original_max_position_embeddings"),
      string_key("model.init_from", "",
                 "start from these weights instead of the seeded init: a trainer_state.h5 (group /model), "
                 "a checkpoint's trainer_state.h5, or a Hugging Face export (directory or .safetensors)"),
      // [tokenizer]
      string_key("tokenizer.path", "",
                 "\"bytes\" (slimpi's byte tokenizer), or a Hugging Face tokenizer directory / tokenizer.json "
                 "(byte-level BPE); \"\" = model.init_from's directory when it holds a tokenizer.json, else bytes"),
      // [data]
      string_key("data.path", "", "JSONL training file (relative paths: to the working directory)"),
      string_key("data.input_key", "prompt",
                 "JSONL key of the prompt: its text, or (with data.chat_template) a list of {role, content} messages"),
      string_key("data.response_key", "response", "JSONL key of the response text (SFT)"),
      string_key("data.label_key", "label", "JSONL key of the label the reward compares with (RL)"),
      string_key("data.metadata_key", "", "JSONL key of per-prompt metadata kept with the prompt (\"\" = none)"),
      choice_key("data.chat_template", "none", with_auto(chat_templates().names()),
                 "render prompts as conversations (a string prompt is one user message): chatml (Qwen2/2.5), "
                 "llama3 (Llama 3 Instruct), qwen3 (Qwen3, <think> rules); none = the prompt text as it is; auto = "
                 "the one the tokenizer's model ships when slimpi implements it (none when it ships none)"),
      string_key("data.system_prompt", "",
                 "with a chat template: a system message put first in every conversation that has none "
                 "(Qwen2.5-Instruct's default: \"You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\")"),
      bool_key("data.enable_thinking", true,
               "qwen3 template: false opens every generation with an empty <think></think> block"),
      bool_key("data.skip_bad_lines", false, "skip malformed prompt lines (counted in rollout/skipped_lines) instead of stopping"),
      // [rollout]
      int_key("rollout.rollout_batch_size", 32, 1, 1e9, "prompts", "prompt groups trained on per step"),
      int_key("rollout.n_samples_per_prompt", 1, 1, 1e6, "samples", "responses generated per prompt (a group)"),
      int_key("rollout.over_sampling_batch_size", 0, 0, 1e9, "prompts",
              "groups generated per round when a dynamic filter drops some (0 = rollout_batch_size)"),
      choice_key("rollout.dynamic_filter", "none", dynamic_filters().names(),
                 "drop groups whose rewards are all equal (nonzero_std) and sample more"),
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
              "last token) and send the KV rows over MPI to the decode engines (the other rollout ranks), which "
              "decode; 0 = every engine does both. Split placement, one-rank engines"),
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
               "continues a conversation (prompt + response + more) re-uses their KV"),
      choice_key("rollout.environment", "none", environments().names(),
                 "multi-turn episodes (docs/environments.md): every sample talks to an environment turn after turn "
                 "(command = rollout.env_command's processes speaking the JSON-lines protocol; calculator = the "
                 "built-in calculator tool); none = one response per prompt"),
      string_key("rollout.env_command", "",
                 "environment = command: the program (run through /bin/sh -c), rollout.env_processes of them per "
                 "rollout rank"),
      int_key("rollout.env_processes", 1, 1, 4096, "processes", "environment = command: processes per rollout rank"),
      float_key("rollout.env_timeout_s", 60.0, 0.01, 1e6, "s",
                "environment: time for a reply to a reset or step; past it the episode fails (and its process is "
                "restarted when it has written nothing for that long)"),
      int_key("rollout.env_max_reply_bytes", 1 << 20, 64, 1e10, "bytes",
              "environment = command: longest reply line; a longer one restarts the process"),
      int_key("rollout.env_max_stderr_bytes", 1 << 16, 0, 1e10, "bytes",
              "environment = command: stderr lines of a process logged (prefixed with the process) per process "
              "start; the rest is read and dropped"),
      float_key("rollout.env_cpu_limit_s", 0.0, 0.0, 1e9, "s",
                "environment = command: CPU seconds per process (RLIMIT_CPU over its life; 0 = none)"),
      int_key("rollout.env_memory_limit_mb", 0, 0, 1e9, "MiB",
              "environment = command: address space per process (RLIMIT_AS; 0 = none)"),
      int_key("rollout.env_max_restarts", 10, 0, 1e9, "restarts",
              "environment = command: restarts of one process after failures before the job ends"),
      bool_key("rollout.env_fail_job", false,
               "environment: an episode whose environment fails ends the job (default: that episode ends with "
               "status 8 env_failed and its group is not trained)"),
      int_key("rollout.env_max_turns", 8, 1, 1e6, "turns", "environment: model turns per episode at most"),
      int_key("rollout.env_max_total_tokens", 0, 0, 1e9, "tokens",
              "environment: response tokens of an episode (model and observation tokens; 0 = 4 x rollout.max_new_tokens); "
              "rollout.max_new_tokens bounds each model turn"),
      int_key("rollout.env_max_observation_tokens", 1024, 1, 1e9, "tokens",
              "environment: a longer observation ends its episode (truncated, error class overlong)"),
      choice_key("rollout.env_reward", "last", {"last", "sum"},
                 "environment: an episode's reward is its last step's reward, or the sum over its steps"),
      float_key("rollout.env_episode_wall_s", 0.0, 0.0, 1e9, "s",
                "environment: an episode is truncated at its first turn boundary past this wall time (0 = none)"),
      // [reward]
      choice_key("reward.style", "exact_match", reward_styles().names(),
                 "verifier that scores responses against labels"),
      string_key("reward.command", "", "style command: program reading JSON lines, answering one number per line"),
      float_key("reward.command_timeout_s", 60.0, 0.01, 1e6, "s", "style command: time limit per batch"),
      int_key("reward.command_max_stderr_bytes", 1 << 16, 0, 1e10, "bytes",
              "style command: stderr lines of the command logged a call (prefixed); the rest read and dropped, its "
              "last lines logged before an error"),
      // [eval]
      string_key("eval.path", "", "held-out prompts (JSONL with data.input_key and data.label_key; \"\" = no eval)"),
      int_key("eval.interval", 0, 0, 1e9, "steps", "evaluate every this many steps (0 = before the first and at the end)"),
      int_key("eval.n_samples", 1, 1, 1e6, "samples", "samples per prompt for pass@k at rollout.temperature (1 = greedy only)"),
      float_key("eval.stop_at_pass1", 0.0, 0.0, 1.0, "", "end the run once greedy eval pass@1 reaches this (0 = never)"),
      // [checkpoint]
      string_key("checkpoint.dir", "", "checkpoint root (\"\" = <run dir>/ckpt); step_XXXXXXXX/ directories inside"),
      int_key("checkpoint.interval", 0, 0, 1e9, "steps",
              "checkpoint every this many steps (0 = only at the end, at run.job_steps and on SIGTERM/SIGUSR1)"),
      int_key("checkpoint.keep_last", 2, 0, 1e9, "", "complete checkpoints kept (0 = all)"),
      int_key("checkpoint.keep_every", 0, 0, 1e9, "steps", "also keep checkpoints whose step is a multiple of this"),
      string_key("checkpoint.resume", "auto",
                 "auto: newest verified checkpoint (none = fresh start); never: fresh start; or a checkpoint directory"),
      // [teacher]
      string_key("teacher.path", "",
                 "on-policy distillation's teacher: a Hugging Face directory (its own shape; its tokenizer must "
                 "equal the student's) or a slimpi trainer_state.h5 / checkpoint directory (the student's shape)"),
      choice_key("teacher.placement", "trainer", {"trainer", "rollout"},
                 "where the teacher scores the samples: trainer = every trainer rank holds it; rollout = the router "
                 "(rollout rank 0, split placement) scores each batch as it is generated, off the trainers' time"),
      int_key("teacher.top_k", 16, 1, 4096, "tokens",
              "train.opd_topk_loss_coef > 0: the teacher's most likely tokens per position the loss compares"),
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
      // [debug]
      bool_key("debug.rollout_only", false, "generate and score rollouts but never train (slime's debug_rollout_only)"),
      bool_key("debug.train_only", false,
               "train on the samples recorded in debug.load_rollouts instead of generating (slime's debug_train_only)"),
      string_key("debug.load_rollouts", "", "debug.train_only: a rollouts.h5 whose step s samples train step s"),
      // [train]
      choice_key("train.mode", "rl", {"rl", "sft"},
                 "rl: policy-gradient steps on rollouts; sft: supervised steps on data.path"),
      choice_key("train.async", "off", step_schedules().names(),
                 "split placement: one_step_off generates step k+1's batch with step k's weights while the "
                 "trainers train on step k's (staleness 1); full = the rollout ranks generate continuously, "
                 "weights reach them between engine iterations, trainers take a batch when one is queued; "
                 "off = generate, then train"),
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
               "token mean over the step instead of the mean over samples of each sample's token mean"),
  };
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

const char* key_type_name(KeyType type) {
  switch (type) {
    case KeyType::Int: return "integer";
    case KeyType::Float: return "float";
    case KeyType::Bool: return "boolean";
    case KeyType::String: return "string";
    case KeyType::StringList: return "array of strings";
  }
  return "?";
}

std::string deck_value_type_name(const DeckValue& value) {
  static const KeyType order[] = {KeyType::Int, KeyType::Float, KeyType::Bool, KeyType::String,
                                  KeyType::StringList};
  return key_type_name(order[value.index()]);
}

std::string format_deck_value(const DeckValue& value) {
  struct Formatter {
    std::string operator()(int64_t v) const { return fmt::format("{}", v); }
    std::string operator()(double v) const {
      if (std::isnan(v)) return "nan";
      if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
      std::string s = fmt::format("{}", v);
      if (s.find_first_of(".e") == std::string::npos) s += ".0";
      return s;
    }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(const std::string& v) const {
      std::string out = "\"";
      for (char c : v) {
        switch (c) {
          case '"': out += "\\\""; break;
          case '\\': out += "\\\\"; break;
          case '\n': out += "\\n"; break;
          case '\t': out += "\\t"; break;
          default: out += c;
        }
      }
      return out + "\"";
    }
    std::string operator()(const std::vector<std::string>& v) const {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + (*this)(v[i]);
      return out + "]";
    }
  };
  return std::visit(Formatter{}, value);
}

std::optional<std::string> check_deck_value(const KeySpec& spec, DeckValue& value) {
  bool type_ok = false;
  switch (spec.type) {
    case KeyType::Int: type_ok = std::holds_alternative<int64_t>(value); break;
    case KeyType::Float:
      if (auto* i = std::get_if<int64_t>(&value)) value = static_cast<double>(*i);
      type_ok = std::holds_alternative<double>(value);
      break;
    case KeyType::Bool: type_ok = std::holds_alternative<bool>(value); break;
    case KeyType::String: type_ok = std::holds_alternative<std::string>(value); break;
    case KeyType::StringList: type_ok = std::holds_alternative<std::vector<std::string>>(value); break;
  }
  if (!type_ok)
    return fmt::format("key '{}' must be {} {}, got {} {}", spec.key,
                       spec.type == KeyType::Int ? "an" : "a", key_type_name(spec.type),
                       deck_value_type_name(value), format_deck_value(value));
  if (spec.min || spec.max) {
    double x = spec.type == KeyType::Int ? static_cast<double>(std::get<int64_t>(value))
                                         : std::get<double>(value);
    if ((spec.min && !(x >= *spec.min)) || (spec.max && !(x <= *spec.max)))
      return fmt::format("key '{}' = {} is out of range [{}, {}]{}", spec.key,
                         format_deck_value(value), spec.min ? fmt::format("{:g}", *spec.min) : "-inf",
                         spec.max ? fmt::format("{:g}", *spec.max) : "inf",
                         spec.unit.empty() ? "" : " " + spec.unit);
  }
  if (!spec.choices.empty()) {
    const auto& s = std::get<std::string>(value);
    if (std::find(spec.choices.begin(), spec.choices.end(), s) == spec.choices.end())
      return fmt::format("key '{}' = \"{}\" is not one of: {}", spec.key, s,
                         fmt::join(spec.choices, ", "));
  }
  return std::nullopt;
}

Schema::Schema() : keys_(declare_keys()) {}

const Schema& Schema::instance() {
  static const Schema schema;
  return schema;
}

const KeySpec* Schema::find(const std::string& key) const {
  for (const auto& spec : keys_)
    if (spec.key == key) return &spec;
  return nullptr;
}

bool Schema::is_table(const std::string& prefix) const {
  for (const auto& spec : keys_)
    if (spec.key.size() > prefix.size() && spec.key.compare(0, prefix.size(), prefix) == 0 &&
        spec.key[prefix.size()] == '.')
      return true;
  return false;
}

std::string Schema::nearest_key(const std::string& key) const {
  // Compare whole dotted names, and the last part alone (a key put in the wrong table:
  // "rollout.seed" -> "run.seed"); keep the closest within a third of the length.
  auto leaf = [](const std::string& k) { return k.substr(k.rfind('.') + 1); };
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const auto& spec : keys_) {
    size_t d = std::min(edit_distance(key, spec.key), edit_distance(leaf(key), leaf(spec.key)) + 1);
    if (d < best_distance) {
      best_distance = d;
      best = spec.key;
    }
  }
  size_t limit = std::max<size_t>(2, leaf(key).size() / 3);
  return best_distance <= limit ? best : "";
}

}  // namespace slimpi
