#include "rollout/engine.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>

#include <algorithm>

#include "core/timer.h"
#include "kernels/counter_rng.h"
#include "kernels/sampling.h"
#include "kernels/sampling_tensor.h"
#include "model/exact_ops.h"
#include "model/log_probs.h"
#include "model/precision.h"
#include "rollout/engine_group.h"
#include "rollout/engine_sequence.h"
#include "tokenizer/byte_tokenizer.h"

namespace slimpi {

EngineStats& EngineStats::operator+=(const EngineStats& o) {
  zip(*this, o, [](auto& mine, const auto& other) { mine += other; });
  return *this;
}

EngineStats EngineStats::operator-(const EngineStats& o) const {
  EngineStats d = *this;
  zip(d, o, [](auto& mine, const auto& other) { mine -= other; });
  return d;
}

int64_t engine_pool_slots(const EngineConfig& cfg) { return (cfg.kv_cache_tokens / cfg.block_size) * cfg.block_size; }

int64_t engine_state_slots(const EngineConfig& cfg, const ModelConfig& model) {
  return model.is_hybrid() ? cfg.max_running * (cfg.spec_steps > 0 ? 2 : 1) : 0;
}

KvCache allocate_engine_cache(const EngineConfig& cfg, const Transformer& model) {
  // Speculation: the first MTP depth's layer, and a scratch slot per chain step past the
  // first of every sequence that can run.
  const int64_t scratch = cfg.spec_steps > 0 ? cfg.max_running * cfg.spec_steps : 0;
  return KvCache::allocate(model.config(), engine_pool_slots(cfg) + scratch,
                           at::TensorOptions()
                               .dtype(cfg.kv_cache_dtype == at::ScalarType::Undefined ? model.weight_dtype()
                                                                                      : cfg.kv_cache_dtype)
                               .device(model.device()),
                           model.tensor_shard().size, /*mtp_layers=*/cfg.spec_steps > 0 ? 1 : 0, /*latent=*/true,
                           /*n_state_slots=*/engine_state_slots(cfg, model.config()));
}

Precision engine_precision(const Transformer& model) {
  return model.weight_dtype() == at::kBFloat16 ? Precision::BF16 : Precision::FP32;
}

Engine::Engine(const EngineConfig& cfg, const Transformer& model, MPI_Comm group)
    : cfg_(cfg),
      model_(model),
      group_(group),
      allocator_(cfg.kv_cache_tokens / cfg.block_size),
      prefix_(allocator_, cfg.block_size),
      cache_(allocate_engine_cache(cfg, model)),
      precision_(engine_precision(model)) {
  SLIMPI_CHECK(cfg.block_size >= 1 && cfg.max_running >= 1 && cfg.max_batch_tokens >= cfg.max_running &&
                   cfg.chunked_prefill_tokens >= 0,
               "engine limits: block_size {}, max_running {}, max_batch_tokens {} (needs >= max_running), "
               "chunked_prefill_tokens {}",
               cfg.block_size, cfg.max_running, cfg.max_batch_tokens, cfg.chunked_prefill_tokens);
  SLIMPI_CHECK((group != MPI_COMM_NULL) == (model.tensor_shard().size > 1) && model.tensor_shard().rank == 0,
               "engine: a tensor-parallel engine is led by its model's tensor rank 0 and needs its group's "
               "communicator (model tensor rank {} of {})", model.tensor_shard().rank, model.tensor_shard().size);
  if (speculative()) {
    SLIMPI_CHECK(model.n_mtp_layers() > 0, "speculative decoding drafts with the policy's MTP layers, and this model "
                 "has none (model.mtp_num_layers = 0)");
    SLIMPI_CHECK(cfg.spec_steps <= EngineStats::kMaxSpecSteps, "speculative decoding: {} chain steps (at most {})",
                 cfg.spec_steps, EngineStats::kMaxSpecSteps);
    SLIMPI_CHECK(group == MPI_COMM_NULL, "speculative decoding in a tensor-parallel engine is not implemented");
    block_last_hidden_ = at::zeros({allocator_.n_blocks(), model.config().hidden_size},
                                   at::TensorOptions().dtype(at::kFloat).device(model.device()));
    scratch_slot0_ = engine_pool_slots(cfg);
  }
  SLIMPI_CHECK(!cfg.prefill_only || (!speculative() && group == MPI_COMM_NULL),
               "a prefill engine (rollout.prefill_ranks) with speculative decoding or tensor parallelism is not "
               "implemented");
  if (hybrid()) {
    SLIMPI_CHECK(!cfg.prefix_cache, "an engine of a hybrid linear-attention model runs without the prefix cache "
                 "(rollout.prefix_cache = false)");
    for (int32_t s = int32_t(cfg.max_running) - 1; s >= 0; --s) free_state_slots_.push_back(s);
  }
}

Engine::~Engine() {
  for (auto& s : running_) free_blocks(*s);
  for (auto& s : waiting_) free_blocks(*s);
  prefix_.clear();
}

void Engine::add_request(const GenerationRequest& request) {
  const int64_t bs = cfg_.block_size, p = static_cast<int64_t>(request.prompt.size());
  SLIMPI_CHECK(p >= 1, "group {}: empty prompt", request.group_index);
  SLIMPI_CHECK(p + request.params.max_new_tokens <= model_.config().max_seq_len,
               "group {}: prompt of {} tokens + max_new_tokens {} exceeds model.max_seq_len = {}",
               request.group_index, p, request.params.max_new_tokens, model_.config().max_seq_len);
  SLIMPI_CHECK(request.n_samples >= 1 && request.n_samples <= cfg_.max_running,
               "group {}: {} samples but the engine runs at most {} sequences", request.group_index,
               request.n_samples, cfg_.max_running);
  const int64_t group_blocks = (p + bs - 1) / bs + (p % bs ? request.n_samples - 1 : 0);
  const int64_t longest = (p + request.params.max_new_tokens + bs - 1) / bs;
  SLIMPI_CHECK(std::max(group_blocks, longest) <= allocator_.n_blocks(),
               "group {}: needs {} KV blocks but the cache has {} (raise rollout.kv_cache_tokens)",
               request.group_index, std::max(group_blocks, longest), allocator_.n_blocks());
  auto seq = std::make_unique<Sequence>();
  seq->request = std::make_shared<const GenerationRequest>(request);
  seq->tokens = request.prompt;
  seq->prompt_length = p;
  waiting_.push_back(std::move(seq));
}

void Engine::add_prefilled(const WorkItem& item, KvTransfer kv) {
  const GenerationRequest& request = item.request;
  const int64_t n = int64_t(item.is_group() ? request.prompt.size() : item.partial.tokens.size());
  SLIMPI_CHECK(!cfg_.prefill_only, "group {}: a prefill engine does not take prefilled prompts", request.group_index);
  SLIMPI_CHECK(kv.group_index == request.group_index && kv.n_positions == n - 1,
               "group {}: the KV rows handed over are group {}'s {} positions, not this sequence's first {}",
               request.group_index, kv.group_index, kv.n_positions, n - 1);
  add_work(item);
  waiting_.back()->arrived_kv = std::make_shared<const KvTransfer>(std::move(kv));
}

std::vector<std::pair<GenerationRequest, KvTransfer>> Engine::take_prefilled() {
  std::vector<std::pair<GenerationRequest, KvTransfer>> out;
  out.swap(prefilled_);
  return out;
}

void Engine::add_work(const WorkItem& item) {
  if (item.is_group()) return add_request(item.request);
  const Sample& part = item.partial;
  const int64_t r = part.response_length();
  SLIMPI_CHECK(part.index >= 0 && part.index < item.request.n_samples && part.prompt_length >= 1 && r >= 0 &&
                   part.prompt() == item.request.prompt && r < item.request.params.max_new_tokens &&
                   int64_t(part.rollout_log_probs.size()) == r && int64_t(part.weight_versions.size()) == r &&
                   (part.sampling_support.empty() || int64_t(part.sampling_support.size()) == r),
               "group {} sample {}: a partial response that does not continue its request ({} tokens, {} log-probs, "
               "{} versions)",
               item.request.group_index, part.index, r, part.rollout_log_probs.size(), part.weight_versions.size());
  add_request(item.request);  // its checks, and a sequence that becomes this sample's
  Sequence& seq = *waiting_.back();
  seq.sample_index = part.index;
  seq.tokens = part.tokens;
  seq.log_probs = part.rollout_log_probs;
  seq.support = part.sampling_support.empty() ? std::vector<int32_t>(size_t(r), 0) : part.sampling_support;
  seq.versions = part.weight_versions;
  seq.spec_drafted = part.spec_drafted;
  seq.spec_accepted = part.spec_accepted;
  seq.spec_passes = part.spec_passes;
}

WorkItem Engine::to_work(const Sequence& seq) const {
  WorkItem w;
  w.request = *seq.request;
  if (seq.is_group()) return w;
  Sample& s = w.partial;
  s.group_index = seq.request->group_index;
  s.index = seq.sample_index;
  s.status = SampleStatus::Pending;
  s.tokens = seq.tokens;
  s.prompt_length = seq.prompt_length;
  s.rollout_log_probs = seq.log_probs;
  s.sampling_support = seq.support;
  s.weight_versions = seq.versions;
  s.spec_drafted = int32_t(seq.spec_drafted);
  s.spec_accepted = int32_t(seq.spec_accepted);
  s.spec_passes = int32_t(seq.spec_passes);
  return w;
}

std::vector<WorkItem> Engine::in_flight() const {
  std::vector<const Sequence*> running;
  for (const auto& s : running_) running.push_back(s.get());
  std::sort(running.begin(), running.end(), [](auto* a, auto* b) { return a->arrival < b->arrival; });
  std::vector<WorkItem> out;
  for (const Sequence* s : running) out.push_back(to_work(*s));
  for (const auto& s : waiting_) out.push_back(to_work(*s));
  return out;
}

std::vector<WorkItem> Engine::take_in_flight() {
  std::vector<WorkItem> out = in_flight();
  for (auto& s : running_) free_blocks(*s);
  for (auto& s : waiting_) free_blocks(*s);
  running_.clear();
  waiting_.clear();
  return out;
}

void Engine::free_blocks(Sequence& seq) {
  for (int32_t b : seq.blocks) allocator_.unref(b);
  for (int32_t b : seq.fork_blocks) allocator_.unref(b);
  seq.blocks.clear();
  seq.fork_blocks.clear();
  if (seq.state_slot >= 0) free_state_slots_.push_back(seq.state_slot);
  seq.state_slot = -1;
  seq.n_computed = 0;
  seq.mtp_computed = 0;
  seq.routing_kept_until = 0;
  truncate_draft(seq, 0);
}

// Takes blocks for every token of `seq` now (prefix-cache hits first), and for a group
// prompt the partial-block copies its fork will need. False (nothing held) if the
// cache cannot hold it even after evicting unreferenced prefix blocks.
bool Engine::admit(Sequence& seq) {
  const int64_t bs = cfg_.block_size, n = static_cast<int64_t>(seq.tokens.size());
  std::vector<int32_t> matched;
  if (cfg_.prefix_cache) {
    matched = prefix_.match_prefix(seq.tokens, n - 1);  // the last token is always computed: its logits are needed
    // Every admission counts, as a request does in SGLang's hit rate: a group's prompt, an
    // episode turn's whole context (a continued sample), a preempted sequence again. (A
    // prefilled prompt's hits save no computation here, only memory: counted where it was
    // prefilled.)
    if (!seq.arrived_kv) {
      stats_.prefix_query_tokens += n;
      stats_.prefix_hit_tokens += static_cast<int64_t>(matched.size()) * bs;
    }
  }
  const int64_t forks =
      seq.is_group() && seq.prompt_length % bs && !cfg_.prefill_only ? seq.request->n_samples - 1 : 0;
  const int64_t need = (n + bs - 1) / bs - static_cast<int64_t>(matched.size()) + forks;
  if (allocator_.n_free() < need) prefix_.evict(need - allocator_.n_free());
  if (allocator_.n_free() < need) {
    for (int32_t b : matched) allocator_.unref(b);
    return false;
  }
  seq.blocks = matched;
  seq.n_computed = static_cast<int64_t>(matched.size()) * bs;
  if (hybrid()) {  // (admission keeps the running sequences within max_running: a slot is free)
    SLIMPI_CHECK(!free_state_slots_.empty(), "engine: no free state slot for a hybrid model's sequence");
    seq.state_slot = free_state_slots_.back();
    free_state_slots_.pop_back();
  }
  // The matched blocks hold the draft's entries up to the one their last token completes
  // (its slot is in the next block): that one is computed from the stored hidden state.
  seq.mtp_computed = std::max<int64_t>(0, seq.n_computed - 1);
  while (static_cast<int64_t>(seq.blocks.size()) * bs < n) seq.blocks.push_back(*allocator_.allocate());
  for (int64_t i = 0; i < forks; ++i) seq.fork_blocks.push_back(*allocator_.allocate());
  if (seq.arrived_kv) {  // a prefill engine's rows: the positions past the prefix-cache hit
    Stopwatch clock;
    const KvTransfer& kv = *seq.arrived_kv;
    std::vector<int64_t> slots;
    for (int64_t p = seq.n_computed; p < kv.n_positions; ++p) slots.push_back(seq.slot(p, bs));
    if (!slots.empty()) scatter_kv_rows(cache_, kv, seq.n_computed, slots);
    if (hybrid() && kv.n_positions > 0) scatter_state(cache_, kv, seq.state_slot);  // (its state after them)
    stats_.kv_received_tokens += kv.n_positions;
    stats_.kv_received_bytes += kv.bytes();
    seq.n_computed = std::max(seq.n_computed, kv.n_positions);
    seq.arrived_kv.reset();
    stats_.kv_receive_s += clock.seconds();
  }
  return true;
}

// Makes sure seq's blocks cover n_positions, evicting unreferenced prefix blocks, then
// (may_preempt) preempting younger sequences. False when seq itself had to be
// preempted, or, without preemption, when the free blocks ran out first.
bool Engine::reserve_slots(Sequence& seq, int64_t n_positions, bool may_preempt) {
  while (static_cast<int64_t>(seq.blocks.size()) * cfg_.block_size < n_positions) {
    if (allocator_.n_free() == 0) prefix_.evict(1);
    if (auto b = allocator_.allocate()) {
      seq.blocks.push_back(*b);
      continue;
    }
    if (!may_preempt) return false;
    auto youngest = std::max_element(running_.begin(), running_.end(),
                                     [](const auto& a, const auto& b) { return a->arrival < b->arrival; });
    Sequence* victim = youngest->get();
    preempt(*victim);
    if (victim == &seq) return false;
  }
  return true;
}

void Engine::preempt(Sequence& victim) {
  ++stats_.preemptions;
  free_blocks(victim);
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& s) { return s.get() == &victim; });
  waiting_.push_front(std::move(*it));  // first in line to be recomputed
  running_.erase(it);
}

std::vector<std::unique_ptr<Engine::Sequence>> Engine::fork(std::unique_ptr<Sequence> leader) {
  const int64_t bs = cfg_.block_size, p = leader->prompt_length, full = p / bs;
  std::vector<std::unique_ptr<Sequence>> out;
  for (int64_t i = 1; i < leader->request->n_samples; ++i) {
    auto s = std::make_unique<Sequence>();
    s->request = leader->request;
    s->sample_index = i;
    s->tokens = leader->tokens;
    s->prompt_length = p;
    s->n_computed = p;
    s->mtp_computed = leader->mtp_computed;
    s->row_base = leader->row_base;  // this iteration's forward rows are the group's
    s->row_first = leader->row_first;
    s->row_count = leader->row_count;
    s->arrival = leader->arrival;
    for (int64_t b = 0; b < full; ++b) {
      allocator_.ref(leader->blocks[b]);
      s->blocks.push_back(leader->blocks[b]);
    }
    if (hybrid()) {  // the prompt's state, copied for each sample
      SLIMPI_CHECK(!free_state_slots_.empty(), "engine: no free state slot for sample {} of group {}", i,
                   leader->request->group_index);
      s->state_slot = free_state_slots_.back();
      free_state_slots_.pop_back();
      cache_.copy_state(leader->state_slot, s->state_slot);
      if (group_ != MPI_COMM_NULL) pending_state_copies_.emplace_back(leader->state_slot, s->state_slot);
    }
    if (p % bs) {  // copy-on-write of the shared partial block, done at the fork
      const std::pair<int32_t, int32_t> copy{leader->blocks[full], leader->fork_blocks[i - 1]};
      copy_kv_blocks(cache_, {copy}, bs);
      if (group_ != MPI_COMM_NULL) pending_block_copies_.push_back(copy);  // the group copies it before the next forward
      s->blocks.push_back(copy.second);
    }
    out.push_back(std::move(s));
  }
  leader->fork_blocks.clear();  // handed to the samples
  leader->sample_index = 0;
  out.insert(out.begin(), std::move(leader));
  return out;
}

bool Engine::finished(Sequence& seq) const {
  const SamplingParams& p = seq.request->params;
  const int64_t last = seq.tokens.back();
  if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), last) != p.stop_token_ids.end()) {
    seq.finish = SampleStatus::Completed;
    return true;
  }
  if (!p.stop_strings.empty()) {
    const int64_t from = seq.prompt_length + std::min(seq.request->stop_strings_from, seq.n_response());
    const std::vector<int64_t> response(seq.tokens.begin() + from, seq.tokens.end());
    const std::string text = cfg_.tokenizer ? cfg_.tokenizer->decode(response) : ByteTokenizer().decode(response);
    for (const auto& stop : p.stop_strings)
      if (!stop.empty() && text.size() >= stop.size() && text.compare(text.size() - stop.size(), stop.size(), stop) == 0) {
        seq.finish = SampleStatus::Completed;
        return true;
      }
  }
  if (seq.n_response() >= p.max_new_tokens || int64_t(seq.tokens.size()) >= model_.config().max_seq_len) {
    seq.finish = SampleStatus::Truncated;
    return true;
  }
  return false;
}

Sample Engine::to_sample(Sequence& seq) const {
  Sample s;
  s.group_index = seq.request->group_index;
  s.index = seq.sample_index;
  s.status = seq.finish;
  s.tokens = seq.tokens;
  s.prompt_length = seq.prompt_length;
  s.rollout_log_probs = seq.log_probs;
  const bool truncated_support = std::any_of(seq.support.begin(), seq.support.end(), [](int32_t k) { return k > 0; });
  if (truncated_support) s.sampling_support = seq.support;
  s.weight_versions = seq.versions;
  s.spec_drafted = seq.spec_drafted;
  s.spec_accepted = seq.spec_accepted;
  s.spec_passes = seq.spec_passes;
  if (cache_.routing.defined() && seq.n_computed > 0) {  // the routing of every computed token
    const int64_t bs = cfg_.block_size;
    std::vector<int64_t> slots;
    for (int64_t p = 0; p < seq.n_computed; ++p) slots.push_back(seq.slot(p, bs));
    const at::Tensor rows =
        cache_.routing.index_select(0, at::tensor(slots, at::kLong).to(cache_.routing.device())).cpu().contiguous();
    s.routing.assign(rows.data_ptr<int16_t>(), rows.data_ptr<int16_t>() + rows.numel());
  }
  return s;
}

// One iteration: admit, reserve, schedule, forward, sample, retire.
std::vector<Sample> Engine::step() {
  if (!has_work()) return {};
  if (cfg_.prefill_only) return step_prefill();
  ++stats_.iterations;
  for (auto& s : running_) s->row_base = -1;
  admit_waiting();
  reserve_decode_slots();
  const ScheduledBatch batch = schedule_batch();
  at::Tensor hidden;                                                            // [T, d] (speculation)
  const at::Tensor logits = forward_batch(batch, speculative() ? &hidden : nullptr);  // [R, V]
  if (speculative()) advance_draft_cache(hidden, /*after_sampling=*/false);
  sample_next_tokens(batch, logits);
  if (speculative()) advance_draft_cache(hidden, /*after_sampling=*/true);
  return retire_finished();
}

// 1. Admission, first come first served. A group still prefilling counts as the samples
//    it will fork into, so that at most max_running sequences ever run (in a prefill
//    engine, which never forks, as one).
void Engine::admit_waiting() {
  auto slots_of = [&](const Sequence& s) { return s.is_group() && !cfg_.prefill_only ? s.request->n_samples : 1; };
  int64_t running = 0;
  for (const auto& s : running_) running += slots_of(*s);
  while (!waiting_.empty()) {
    Sequence& s = *waiting_.front();
    const int64_t slots = slots_of(s);
    if (running + slots > cfg_.max_running || !admit(s)) break;
    running += slots;
    s.arrival = arrivals_++;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

// 2. Room for one more token of every decoding sequence, oldest first (a sequence
//    without room preempts the newest).
void Engine::reserve_decode_slots() {
  std::vector<Sequence*> order;
  for (auto& s : running_) order.push_back(s.get());
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->arrival < b->arrival; });
  for (Sequence* s : order) {
    bool still_running = std::any_of(running_.begin(), running_.end(), [&](const auto& r) { return r.get() == s; });
    if (still_running && s->pending() == 1) reserve_slots(*s, static_cast<int64_t>(s->tokens.size()));
  }
  // Speculation: the drafts' positions, and one more (the draft's entry for the token the
  // forward adds lives in the slot after it), from free blocks only: a chain never
  // preempts a sequence; it is cut to what fits (a chain's prefix is verified as exactly).
  if (speculative())
    for (Sequence* s : order) {
      if (s->draft.empty()) continue;
      const bool still_running = std::any_of(running_.begin(), running_.end(), [&](const auto& r) { return r.get() == s; });
      if (!still_running) {
        truncate_draft(*s, 0);
        continue;
      }
      reserve_slots(*s, int64_t(s->tokens.size() + s->draft.size()) + 1, /*may_preempt=*/false);
      const int64_t room = int64_t(s->blocks.size()) * cfg_.block_size - int64_t(s->tokens.size());
      truncate_draft(*s, std::max<int64_t>(0, room));
    }
  SLIMPI_CHECK(!running_.empty(), "engine: no sequence fits in the KV cache ({} blocks of {} tokens)",
               allocator_.n_blocks(), cfg_.block_size);
}

// 3. The batch: decode tokens first, then prefill chunks, within max_batch_tokens; the
//    drafts of speculating sequences take what is left after both (oldest first, each
//    chain cut to what fits), so speculation never holds back a decode or a prefill.
Engine::ScheduledBatch Engine::schedule_batch() {
  ScheduledBatch decodes, prefills;
  int64_t budget = cfg_.max_batch_tokens;
  std::sort(running_.begin(), running_.end(), [](const auto& a, const auto& b) { return a->arrival < b->arrival; });
  for (auto& s : running_)
    if (s->pending() == 1) {
      if (budget > 0) {
        decodes.emplace_back(s.get(), 1);
        --budget;
      } else {
        truncate_draft(*s, 0);  // it does not run this iteration
      }
    }
  int64_t prefill_budget = cfg_.chunked_prefill_tokens > 0 ? std::min(budget, cfg_.chunked_prefill_tokens) : budget;
  for (auto& s : running_)
    if (s->pending() > 1 && prefill_budget > 0) {
      // (a prefill engine stops short of the last prompt token: its decode engine runs it)
      int64_t n = std::min(s->pending() - (cfg_.prefill_only ? 1 : 0), prefill_budget);
      prefills.emplace_back(s.get(), n);
      prefill_budget -= n;
      budget -= n;
    }
  for (auto& [s, n] : decodes) {  // the last token and its drafts
    truncate_draft(*s, std::min<int64_t>(int64_t(s->draft.size()), budget));
    n += int64_t(s->draft.size());
    budget -= int64_t(s->draft.size());
  }
  decodes.insert(decodes.end(), prefills.begin(), prefills.end());
  return decodes;
}

void Engine::truncate_draft(Sequence& s, int64_t n) {
  if (n == 0) {  // the chain's buffers go (a sequence keeps no [D, V] block it does not use)
    std::vector<int64_t>().swap(s.draft);
    std::vector<float>().swap(s.draft_q);
    return;
  }
  if (n >= int64_t(s.draft.size())) return;
  s.draft.resize(size_t(n));
  if (!s.draft_q.empty()) s.draft_q.resize(size_t(n * model_.config().vocab_size));
}

// 4. One forward over the batch. The cache slot of every position each sequence
//    attends to (slot = block_table[p / bs] * bs + p % bs), built here on the host;
//    the model's attention layout takes them to the device in one copy. The LM head runs
//    only on the rows that are sampled or verified (logits_of): a prompt chunk that does
//    not finish its prompt needs none, one that does needs its last. A tensor-parallel
//    engine announces the forward to its group first (rollout/engine_group.h) and samples
//    from the logits gathered over the vocabulary shards.
at::Tensor Engine::forward_batch(const ScheduledBatch& batch, at::Tensor* hidden, bool to_logits) {
  const int64_t bs = cfg_.block_size;
  EngineForward f;
  f.block_copies = std::move(pending_block_copies_);
  pending_block_copies_.clear();
  f.state_copies = std::move(pending_state_copies_);
  pending_state_copies_.clear();
  // The slots of the tokens this forward computes whose MoE routing it records, and their rows of `f.tokens`.
  std::vector<int64_t> routing_slots, routing_rows;
  if (to_logits) f.logit_rows.emplace();
  for (auto [s, n] : batch) {
    if (to_logits)
      for (int64_t r = n - logits_of(*s, n); r < n; ++r) f.logit_rows->push_back(int64_t(f.tokens.size()) + r);
    s->row_base = int64_t(f.tokens.size());
    s->row_first = s->n_computed;
    s->row_count = n;
    const int64_t known = n - int64_t(s->draft.size());  // a drafted sequence's last token, then its drafts
    f.tokens.insert(f.tokens.end(), s->tokens.begin() + s->n_computed, s->tokens.begin() + s->n_computed + known);
    f.tokens.insert(f.tokens.end(), s->draft.begin(), s->draft.end());
    f.n_past.push_back(s->n_computed);
    f.n_new.push_back(n);
    if (hybrid()) f.state_slots.push_back(s->state_slot);
    if (hybrid() && !s->draft.empty())  // the state before the chain, for verify_draft
      cache_.copy_state(s->state_slot, state_snapshot_slot(s->state_slot));
    for (int64_t p = 0; p < s->n_computed + n; ++p) f.slots.push_back(s->slot(p, bs));
    for (int64_t p = std::max(s->n_computed, s->routing_kept_until); p < s->n_computed + n; ++p) {
      routing_slots.push_back(s->slot(p, bs));
      routing_rows.push_back(s->row_base + p - s->n_computed);
    }
    const bool decode = s->pending() == 1 && s->n_computed >= s->prompt_length;  // (a verify pass too)
    if (!decode) stats_.prefill_tokens_computed += n;  // prompts, and recomputation after preemption
  }
  if (group_ != MPI_COMM_NULL) announce(group_, f);
  Stopwatch forward_clock;
  MoeTrace trace;  // a mixture-of-experts policy's routing, kept per slot like K/V
  const bool moe = cache_.routing.defined();
  at::Tensor logits =
      run_engine_forward(model_, cache_, precision_, f, moe ? &trace : nullptr, hidden, to_logits);  // [R, V]
  if (group_ != MPI_COMM_NULL)  // [R, Vp / e] -> [R, V]
    logits = gather_vocab_shards(*model_.tensor_shard().comm, logits, model_.config().vocab_size);
  if (moe) {
    const auto device = cache_.routing.device();
    cache_.routing.index_copy_(0, at::tensor(routing_slots, at::kLong).to(device),
                               trace.chosen.index_select(0, at::tensor(routing_rows, at::kLong).to(trace.chosen.device()))
                                   .to(at::kShort)
                                   .to(device));
  }
  stats_.forward_s += forward_clock.seconds();
  stats_.forward_tokens += static_cast<int64_t>(f.tokens.size());
  return logits;
}

void Engine::release_group() {
  if (group_ == MPI_COMM_NULL) return;
  EngineForward release;
  release.release = true;
  announce(group_, release);
}

// The logits rows a sequence's n forward rows need, its last ones: a chain to verify all
// n; a sequence whose every token is computed by this forward its last row (it samples);
// a prompt chunk that leaves some of its prompt to a later forward none.
int64_t Engine::logits_of(const Sequence& s, int64_t n) {
  if (!s.draft.empty()) return n;
  return s.pending() == n ? 1 : 0;
}

// 5. Sequences whose every token is now computed sample their next token; a group
//    prompt that finished prefilling forks first (all its samples read one row).
//    `logits` holds the rows logits_of chose, in batch order.
void Engine::sample_next_tokens(const ScheduledBatch& batch, const at::Tensor& logits) {
  Stopwatch sample_clock;
  std::vector<Sequence*> samplers;
  std::vector<int64_t> rows;  // the logits row each sampler reads
  int64_t row = 0;
  std::vector<std::unique_ptr<Sequence>> forked;
  for (auto [s, n] : batch) {
    const int64_t own = logits_of(*s, n);
    if (!s->draft.empty()) {  // a chain to verify: its rows decide how many tokens it keeps
      verify_draft(*s, logits.narrow(0, row, n));
      row += own;
      continue;
    }
    s->n_computed += n;
    row += own;
    if (s->pending() != 0) continue;
    if (s->is_group()) {
      if (cfg_.prefix_cache) prefix_.insert(s->tokens, s->blocks, s->prompt_length);
      auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& r) { return r.get() == s; });
      std::unique_ptr<Sequence> leader = std::move(*it);
      running_.erase(it);
      for (auto& f : fork(std::move(leader))) {
        samplers.push_back(f.get());
        rows.push_back(row - 1);
        forked.push_back(std::move(f));
      }
    } else {
      samplers.push_back(s);
      rows.push_back(row - 1);
    }
  }
  for (auto& f : forked) running_.push_back(std::move(f));
  if (!samplers.empty()) sample_rows(samplers, rows, logits);
  stats_.sample_s += sample_clock.seconds();
}

void Engine::sample_rows(const std::vector<Sequence*>& samplers, const std::vector<int64_t>& rows,
                         const at::Tensor& logits) {
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  const int64_t R = static_cast<int64_t>(samplers.size());
  // [R, V] fp32, on the model's device
  const at::Tensor z = logits.index_select(0, at::tensor(rows, long_opts).to(logits.device())).to(at::kFloat);
  std::vector<SamplingRow> params;
  std::vector<DrawCoordinates> draws;
  std::vector<float> temps;
  for (const Sequence* s : samplers) {
    const SamplingParams& p = s->request->params;
    draws.push_back({s->request->seed, uint64_t(s->sample_index), uint64_t(s->n_response())});
    params.push_back({p.temperature, p.top_k, p.top_p, counter_uniform(draws.back().seed, draws.back().sample,
                                                                        draws.back().position)});
    temps.push_back(p.temperature > 0 ? float(p.temperature) : 1.0f);
  }
  at::Tensor next, support;  // [R] int64 each, on z's device
  if (use_tensor_sampler()) {
    SampledTokens sampled = sample_tokens_tensor(z, params, draws);
    next = sampled.tokens;
    support = sampled.support;
  } else {
    const at::Tensor zc = z.contiguous();
    next = at::empty({R}, long_opts);
    at::Tensor support32 = at::empty({R}, at::kInt);
    sample_tokens(zc.data_ptr<float>(), R, zc.size(1), params.data(), next.data_ptr<int64_t>(),
                  support32.data_ptr<int32_t>());
    support = support32.to(at::kLong);
  }
  // Log-probs exactly as the trainer computes them: fp32 logits / T, renormalised over
  // the sampling support (model/log_probs.h). Then tokens, supports and log-probs come
  // to the host in one copy: [3, R] float64 holds int64 token ids exactly (< 2^53).
  const at::Tensor logp = sampled_token_log_probs(z, at::tensor(temps, at::kFloat), next, support);  // [R]
  const at::Tensor host = at::stack({next.to(at::kDouble), support.to(at::kDouble), logp.to(at::kDouble)})
                              .cpu()
                              .contiguous();  // [3, R]
  const double* h = host.data_ptr<double>();
  for (int64_t i = 0; i < R; ++i) {
    Sequence& s = *samplers[i];
    s.tokens.push_back(static_cast<int64_t>(h[i]));
    s.support.push_back(static_cast<int32_t>(h[R + i]));
    s.log_probs.push_back(static_cast<float>(h[2 * R + i]));
    s.versions.push_back(weight_version_);
    ++stats_.generated_tokens;
  }
}

// 6. Retire finished sequences at once.
std::vector<Sample> Engine::retire_finished() {
  std::vector<Sample> done;
  for (auto it = running_.begin(); it != running_.end();) {
    Sequence& s = **it;
    if (!s.is_group() && s.pending() == 1 && s.n_response() > 0 && finished(s)) {
      stats_.prompt_tokens_served += s.prompt_length;
      done.push_back(to_sample(s));
      if (cfg_.prefix_cache && cfg_.cache_responses) prefix_.insert(s.tokens, s.blocks, s.n_computed);
      free_blocks(s);
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  return done;
}

// A prefill engine's iteration: admit, schedule prompt chunks, one forward without the
// LM head, then hand out every prompt computed up to its last token.
std::vector<Sample> Engine::step_prefill() {
  ++stats_.iterations;
  admit_waiting();
  SLIMPI_CHECK(!running_.empty(), "engine: no prompt fits in the KV cache ({} blocks of {} tokens)",
               allocator_.n_blocks(), cfg_.block_size);
  hand_out_prefilled();  // prompts the prefix cache already held
  if (running_.empty()) return {};
  const ScheduledBatch batch = schedule_batch();
  forward_batch(batch, nullptr, /*to_logits=*/false);
  for (auto [s, n] : batch) s->n_computed += n;
  hand_out_prefilled();
  return {};
}

void Engine::hand_out_prefilled() {
  const int64_t bs = cfg_.block_size;
  for (auto it = running_.begin(); it != running_.end();) {
    Sequence& s = **it;
    const int64_t n = s.prompt_length - 1;  // the positions a decode engine takes over
    if (s.n_computed < n) {
      ++it;
      continue;
    }
    Stopwatch clock;
    std::vector<int64_t> slots;
    for (int64_t p = 0; p < n; ++p) slots.push_back(s.slot(p, bs));
    KvTransfer kv = gather_kv_rows(cache_, s.request->group_index, slots, hybrid() && n > 0 ? s.state_slot : -1);
    stats_.kv_sent_tokens += n;
    stats_.kv_sent_bytes += kv.bytes();
    stats_.kv_send_s += clock.seconds();
    if (cfg_.prefix_cache) prefix_.insert(s.tokens, s.blocks, n);
    prefilled_.emplace_back(*s.request, std::move(kv));
    free_blocks(s);
    it = running_.erase(it);
  }
}

std::vector<Sample> Engine::run_to_completion() {
  std::vector<Sample> out;
  while (has_work())
    for (auto& s : step()) out.push_back(std::move(s));
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::tie(a.group_index, a.index) < std::tie(b.group_index, b.index);
  });
  return out;
}

bool Engine::use_tensor_sampler() const {
  if (cfg_.sampler == EngineConfig::Sampler::Auto) return !model_.device().is_cpu();
  return cfg_.sampler == EngineConfig::Sampler::Tensor;
}

void Engine::on_weights_updated(int64_t new_version) {
  SLIMPI_CHECK(!has_work(), "engine: weights updated with {} sequences in flight", running_.size() + waiting_.size());
  prefix_.clear();
  weight_version_ = new_version;
}

}  // namespace slimpi
