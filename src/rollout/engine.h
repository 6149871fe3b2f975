// Engine — one rollout rank's generator: continuous batching over a paged KV cache
// with prefix sharing (what SGLang does), running the policy's incremental forward.
//
// Each step(): admit waiting work while sequences and KV blocks allow; build one batch
// of up to max_batch_tokens tokens (one decode token per running sequence, then
// prefill chunks of admitted prompts); make room for it (evict unreferenced prefix-
// cache blocks, then preempt the youngest sequences, which are re-queued and later
// recomputed); run one forward; sample; retire finished sequences at once (their
// blocks enter the prefix cache first with cache_responses).
// A group's prompt is prefilled once: when its prefill completes it forks into n
// sequences that share the prompt's full blocks and copy its partial last block.
// Tokens depend only on (group seed, sample index, position) and the weights, never
// on batch composition or preemption (counter-based RNG, kernels/counter_rng.h).
// Precision: the model's weight dtype decides it: bf16 weights run bf16 matrix products
// and a bf16 KV cache (model/precision.h); log-probs are fp32 from fp32 logits.
// Tensor parallelism (rollout.tensor_parallel): when the model is one shard of a group,
// this is the group's leader; it announces every forward to the other ranks, which run
// it on their shards (rollout/engine_group.h), and samples from the gathered logits.
// Speculative decoding (EngineConfig::spec_steps, rollout/engine_speculation.cpp): the
// policy's first MTP depth keeps a KV cache layer of its own beside the trunk's (entry m,
// read from the trunk's hidden state at position m and token m + 1, in the slot of
// position m + 1, so that a block's entries depend on its tokens alone and prefix
// sharing holds); after each forward it drafts a chain per decoding sequence (chain
// steps past the first in scratch slots), and the next forward verifies the chain with
// exact rejection sampling (kernels/speculative.h): the tokens are distributed as
// without speculation, and every stored log-prob is the policy's.
// Prefill/decode disaggregation (rollout.prefill_ranks, rollout/disaggregated_router.h):
// a prefill-only engine (EngineConfig::prefill_only) computes each group's prompt up to
// its last token and hands the KV rows out (take_prefilled); a decode engine takes them
// (add_prefilled), writes them into its own blocks at admission, and runs the group from
// there: the last prompt token, the fork, the samples, exactly as if it had prefilled.
// Hybrid linear-attention models (Qwen3.5; ModelConfig::is_hybrid): every admitted sequence
// also holds a state slot of the cache (its Gated DeltaNet layers' conv and recurrent
// state, max_running of them), filled by its prefill, advanced by each forward, copied at
// the fork and released with its blocks; a preempted sequence recomputes it from position
// 0. A state is a whole prefix's, not a block's, so the prefix cache is off for such
// models (EngineConfig::prefix_cache must be false). A speculating engine snapshots a
// drafted sequence's state before its chain is verified; a prefill engine hands the state
// over with the rows (rollout/kv_transfer.h).
// Owned by the rollout driver; single-threaded; the model is shared, not owned.
#pragma once

#include <mpi.h>
#include <slimpi/sample.h>

#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/precision.h"
#include "model/transformer.h"
#include "rollout/block_allocator.h"
#include "rollout/group_worker.h"
#include "rollout/kv_transfer.h"
#include "rollout/prefix_cache.h"
#include "rollout/request.h"
#include "tokenizer/tokenizer.h"

namespace slimpi {

struct EngineConfig {
  int64_t block_size = 16;          // tokens per KV block
  int64_t kv_cache_tokens = 65536;  // KV capacity (rounded down to whole blocks)
  int64_t max_running = 64;         // sequences decoding at once
  int64_t max_batch_tokens = 2048;  // tokens per forward (decode + prefill chunks)
  bool prefix_cache = true;
  // Which executor of the sampling rule runs (kernels/sampling.h): Auto = the host one
  // for a CPU model, the tensor one (on the model's device, no logits copied to the
  // host) otherwise. Both give the same tokens; tests force Tensor on CPU to show it.
  enum class Sampler { Auto, Host, Tensor } sampler = Sampler::Auto;
  // Prompt (and recompute) tokens per forward, summed over the prefill chunks of the
  // iteration; 0 = whatever max_batch_tokens leaves after the decode rows. A long prompt
  // is then prefilled over several iterations while the running sequences keep decoding.
  int64_t chunked_prefill_tokens = 0;
  // A finished sample's full blocks (prompt + response) enter the prefix cache before its
  // blocks are released, so a later prompt that continues it (multi-turn) re-uses them.
  bool cache_responses = false;
  // Decodes responses for the stop strings (null: the byte tokenizer).
  std::shared_ptr<const Tokenizer> tokenizer;
  // Speculative decoding (rollout.speculative = "mtp"): each decoding sequence gets a
  // chain of spec_steps tokens drafted by the policy's first MTP depth, verified by one
  // forward (rollout/engine_speculation.cpp); 0 = off. spec_max_running > 0: no drafts
  // while more sequences than this run.
  int64_t spec_steps = 0;
  int64_t spec_max_running = 0;
  // The KV cache's storage dtype (rollout.kv_cache_dtype; model/kv_cache.h): Undefined =
  // the model's weight dtype; kBFloat16; kFloat8_e4m3fn (per-head scales, fixed at 1).
  at::ScalarType kv_cache_dtype = at::ScalarType::Undefined;
  // A prefill engine (rollout.prefill_ranks): groups are computed up to their prompt's
  // last token, then leave with their KV rows (Engine::take_prefilled); nothing samples.
  // A group holds one running slot here (it never forks).
  bool prefill_only = false;
};

struct EngineStats {
  int64_t iterations = 0;
  int64_t generated_tokens = 0;
  int64_t prompt_tokens_served = 0;     // prompt tokens of every sample returned
  int64_t prefill_tokens_computed = 0;  // prompt (and recompute) tokens actually run
  int64_t prefix_hit_tokens = 0;        // tokens of admitted sequences found in the prefix cache
  int64_t prefix_query_tokens = 0;      // tokens of admitted sequences (prompts, episode turns' contexts)
  int64_t preemptions = 0;
  int64_t forward_tokens = 0;
  double forward_s = 0;
  double sample_s = 0;
  // Speculative decoding: verify passes (one per drafted sequence and forward), drafted and
  // accepted tokens, and per chain step j the drafts offered and accepted there; the
  // seconds of the MTP forwards (keeping the draft's KV cache, drafting).
  static constexpr int kMaxSpecSteps = 8;
  int64_t spec_passes = 0, spec_drafted = 0, spec_accepted = 0;
  int64_t spec_offered_at[kMaxSpecSteps] = {}, spec_accepted_at[kMaxSpecSteps] = {};
  double draft_s = 0;
  // A hybrid model's chains with a rejected draft: their linear layers' state restored to
  // before the chain, and the tokens computed again for it (the last verified token and
  // the accepted drafts; Engine::verify_draft).
  int64_t spec_state_restores = 0, spec_recomputed_tokens = 0;
  // Prefill/decode disaggregation: prompt positions whose KV a prefill engine handed out
  // and a decode engine took in (bytes of the rows; taken in: every position received,
  // those its prefix cache already held and did not write included; its prefix-cache
  // hits on such prompts are not in prefix_hit_tokens), and the seconds each side spent
  // packing and sending, receiving and writing them; per pool, the seconds its engines
  // spent in iterations (busy) and in the routing call (wall), for the busy fractions.
  int64_t kv_sent_tokens = 0, kv_sent_bytes = 0, kv_received_tokens = 0, kv_received_bytes = 0;
  double kv_send_s = 0, kv_receive_s = 0;
  double prefill_busy_s = 0, prefill_wall_s = 0, decode_busy_s = 0, decode_wall_s = 0;

  EngineStats& operator+=(const EngineStats& o);
  EngineStats operator-(const EngineStats& o) const;  // counters since the snapshot o

  // Calls fn(a.c, b.c) for every counter c (int64_t or double), in declaration order:
  // the one list of the fields that the arithmetic and the sum over engines walk.
  template <class A, class B, class Fn>
  static void zip(A& a, B& b, Fn fn) {
    fn(a.iterations, b.iterations);
    fn(a.generated_tokens, b.generated_tokens);
    fn(a.prompt_tokens_served, b.prompt_tokens_served);
    fn(a.prefill_tokens_computed, b.prefill_tokens_computed);
    fn(a.prefix_hit_tokens, b.prefix_hit_tokens);
    fn(a.prefix_query_tokens, b.prefix_query_tokens);
    fn(a.preemptions, b.preemptions);
    fn(a.forward_tokens, b.forward_tokens);
    fn(a.forward_s, b.forward_s);
    fn(a.sample_s, b.sample_s);
    fn(a.spec_passes, b.spec_passes);
    fn(a.spec_drafted, b.spec_drafted);
    fn(a.spec_accepted, b.spec_accepted);
    for (int j = 0; j < kMaxSpecSteps; ++j) fn(a.spec_offered_at[j], b.spec_offered_at[j]);
    for (int j = 0; j < kMaxSpecSteps; ++j) fn(a.spec_accepted_at[j], b.spec_accepted_at[j]);
    fn(a.draft_s, b.draft_s);
    fn(a.kv_sent_tokens, b.kv_sent_tokens);
    fn(a.kv_sent_bytes, b.kv_sent_bytes);
    fn(a.kv_received_tokens, b.kv_received_tokens);
    fn(a.kv_received_bytes, b.kv_received_bytes);
    fn(a.kv_send_s, b.kv_send_s);
    fn(a.kv_receive_s, b.kv_receive_s);
    fn(a.prefill_busy_s, b.prefill_busy_s);
    fn(a.prefill_wall_s, b.prefill_wall_s);
    fn(a.decode_busy_s, b.decode_busy_s);
    fn(a.decode_wall_s, b.decode_wall_s);
    // (counters added later go last: pending_rollout.json stores them in this order)
    fn(a.spec_state_restores, b.spec_state_restores);
    fn(a.spec_recomputed_tokens, b.spec_recomputed_tokens);
  }
};

// The KV cache an engine rank over `model` holds under `cfg`: whole blocks of slots, each
// rank of a tensor-parallel engine its own heads. One definition, so that every rank of
// a group has the leader's slots.
KvCache allocate_engine_cache(const EngineConfig& cfg, const Transformer& model);
// The slots of the pool's blocks (scratch slots for draft chains follow them).
int64_t engine_pool_slots(const EngineConfig& cfg);
// A hybrid model's state slots (none for others): one per sequence that can run, and a
// speculating engine's snapshot of each before its chain is verified (state_snapshot_slot).
int64_t engine_state_slots(const EngineConfig& cfg, const ModelConfig& model);
// The precision an engine's forwards run in: its weights' dtype decides (bf16 or fp32).
Precision engine_precision(const Transformer& model);

class Engine : public GroupWorker {
 public:
  // group: a tensor-parallel engine's MPI communicator (its model a shard whose tensor
  // rank is 0 here: this engine leads the group, rollout/engine_group.h); MPI_COMM_NULL
  // for an engine of one rank.
  Engine(const EngineConfig& cfg, const Transformer& model, MPI_Comm group = MPI_COMM_NULL);
  ~Engine() override;

  // Queues a group. Throws if it can never fit (prompt + max_new_tokens beyond the
  // model or the cache, n_samples beyond max_running).
  void add_request(const GenerationRequest& request) override;
  bool has_work() const override { return !waiting_.empty() || !running_.empty(); }
  // One iteration; returns the samples that finished in it (rollout fields and status
  // set: Completed on a stop token/string, Truncated at max_new_tokens or max_seq_len).
  std::vector<Sample> step() override;
  // Prefill/decode disaggregation. A decode engine: queues `item` (a group, as add_request,
  // or an episode's turn, as add_work) whose sequence's first n - 1 positions (all but its
  // last token) are in `kv` (a prefill engine's rows), written into this engine's blocks at
  // admission (positions the prefix cache already holds are not).
  void add_prefilled(const WorkItem& item, KvTransfer kv);
  // A prefill engine: the groups whose prompts completed since the last call (their blocks
  // are released; full ones stay in the prefix cache), in completion order.
  std::vector<std::pair<GenerationRequest, KvTransfer>> take_prefilled();
  // Steps until every queued request is done; samples in (group, sample) order.
  std::vector<Sample> run_to_completion();

  // Work that moves between engines (train.async = "full", rollout/streaming_router.h).
  // add_work queues a group (as add_request) or one sample's partial response, which
  // is prefilled again (prompt and response) and then continues at its next position:
  // with unchanged weights it yields the tokens it would have yielded uninterrupted.
  void add_work(const WorkItem& item);
  // Everything running (oldest first), then everything queued (in queue order): groups
  // not forked yet as groups, every other sequence as its partial sample (no routing:
  // its KV will be recomputed).
  std::vector<WorkItem> in_flight() const;
  // in_flight(), and the engine emptied: the sequences' blocks released (blocks the
  // prefix cache holds stay until on_weights_updated).
  std::vector<WorkItem> take_in_flight();

  // The weights changed (weight sync): cached prefixes are stale and dropped; the KV
  // pool stays allocated. Only when no request is in flight.
  void on_weights_updated(int64_t new_version);
  int64_t weight_version() const { return weight_version_; }
  bool is_prefill_engine() const { return cfg_.prefill_only; }
  bool caches_prefixes() const { return cfg_.prefix_cache; }
  int64_t max_seq_len() const { return model_.config().max_seq_len; }
  const EngineStats& stats() const { return stats_; }
  // A tensor-parallel engine (its model a shard, rollout/engine_group.h): lets the
  // group's followers return from EngineFollower::follow(). No-op otherwise.
  void release_group();
  int64_t n_free_blocks() const { return allocator_.n_free(); }
  int64_t n_blocks() const { return allocator_.n_blocks(); }
  int64_t block_size() const { return cfg_.block_size; }
  int64_t n_running() const { return static_cast<int64_t>(running_.size()); }
  PrefixCache& prefix_cache() { return prefix_; }

 private:
  struct Sequence;
  // The steps of step(), in order.
  using ScheduledBatch = std::vector<std::pair<Sequence*, int64_t>>;  // each sequence and its new tokens
  void admit_waiting();
  void reserve_decode_slots();
  ScheduledBatch schedule_batch();
  // -> logits [R, V] of the rows logits_of chooses (hidden [T, d], every row); to_logits =
  // false: the final norm's output [T, d]
  at::Tensor forward_batch(const ScheduledBatch& batch, at::Tensor* hidden, bool to_logits = true);
  static int64_t logits_of(const Sequence& s, int64_t n);
  void sample_next_tokens(const ScheduledBatch& batch, const at::Tensor& logits);
  void sample_rows(const std::vector<Sequence*>& samplers, const std::vector<int64_t>& rows, const at::Tensor& logits);
  std::vector<Sample> retire_finished();
  // Prefill engines: step() is admit, schedule, forward, and hand out finished prompts.
  std::vector<Sample> step_prefill();
  void hand_out_prefilled();
  bool admit(Sequence& seq);
  bool use_tensor_sampler() const;
  bool reserve_slots(Sequence& seq, int64_t n_positions, bool may_preempt = true);
  void preempt(Sequence& victim);
  void free_blocks(Sequence& seq);
  std::vector<std::unique_ptr<Sequence>> fork(std::unique_ptr<Sequence> leader);
  bool finished(Sequence& seq) const;
  Sample to_sample(Sequence& seq) const;
  WorkItem to_work(const Sequence& seq) const;
  // Speculative decoding (rollout/engine_speculation.cpp).
  bool speculative() const { return cfg_.spec_steps > 0; }
  // The draft's KV entries whose next token is known, from this forward's hidden states
  // (and the stored block-end ones); after_sampling: those the sampled tokens completed,
  // then each decoding sequence's chain of drafts.
  void advance_draft_cache(const at::Tensor& hidden, bool after_sampling);
  // newest: sequences whose newest entry this call computed, and its row of `out` [R, d].
  void draft_chains(const std::vector<std::pair<Sequence*, int64_t>>& newest, const at::Tensor& out);
  // A drafted sequence's verify rows [1 + D, V]: accepted drafts and one more token
  // appended (up to a stop), its KV and blocks trimmed to them.
  void verify_draft(Sequence& seq, const at::Tensor& rows);
  void trim_blocks(Sequence& seq);
  // Keeps the first n drafts of seq's chain (and their distributions); n = 0 releases
  // the chain's buffers.
  void truncate_draft(Sequence& seq, int64_t n);

  EngineConfig cfg_;
  const Transformer& model_;
  MPI_Comm group_;  // tensor-parallel engines: the group this engine leads (else MPI_COMM_NULL)
  BlockAllocator allocator_;
  PrefixCache prefix_;
  KvCache cache_;
  Precision precision_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  int64_t weight_version_ = 0;
  int64_t arrivals_ = 0;
  // Tensor-parallel engines: the forks' block copies since the last forward, which the
  // group's followers make before it.
  std::vector<std::pair<int32_t, int32_t>> pending_block_copies_;
  std::vector<std::pair<int32_t, int32_t>> pending_state_copies_;  // (a hybrid model's forks: state slots)
  EngineStats stats_;
  std::vector<std::pair<GenerationRequest, KvTransfer>> prefilled_;  // a prefill engine's finished prompts
  // Speculative decoding: the trunk's hidden state at the last position of each block
  // [n_blocks, d] (a draft entry whose next token arrives after its position's forward,
  // or that a prefix-cache hit skipped, reads it there), and the first scratch slot.
  at::Tensor block_last_hidden_;
  int64_t scratch_slot0_ = 0;
  // Hybrid models: the state slots no sequence holds.
  std::vector<int32_t> free_state_slots_;
  bool hybrid() const { return model_.config().is_hybrid(); }
  // Where a speculating hybrid engine keeps a drafted sequence's state while its chain is
  // verified (the slots past the running sequences' own).
  int64_t state_snapshot_slot(int64_t state_slot) const { return cfg_.max_running + state_slot; }
};

}  // namespace slimpi
