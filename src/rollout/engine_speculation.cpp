// Speculative decoding in the engine (rollout/engine.h): the draft's KV cache, its
// chains, and their verification.
//
// The draft is the policy's first MTP depth (model/transformer.h). Its entry m reads the
// trunk's hidden state at position m and the token at m + 1 and predicts the token at
// m + 2; it lives in the draft's cache layer in the slot of position m + 1, so a block's
// entries depend on that block's tokens alone (prefix sharing and forks stay exact). An
// entry is computed as soon as its next token is known: before sampling for prefill
// positions, after it for the tokens sampling (or verification) added. A position whose
// next token comes only in a later forward is the last of its block, and the trunk's
// state there is kept per block (block_last_hidden_) until it is needed.
// A chain: entry n_computed - 1 drafts d_1; step j > 1 runs the same depth at the next
// position on its own previous output and d_{j-1} (EAGLE-style, as SGLang drafts with a
// single MTP layer), its KV in scratch slots. Each draft is drawn from the draft's
// distribution under the request's sampling rule (a stream of its own), and the next
// forward verifies the chain (kernels/speculative.h).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>

#include <algorithm>

#include "core/timer.h"
#include "kernels/counter_rng.h"
#include "kernels/sampling.h"
#include "kernels/small_batch_linear.h"
#include "kernels/speculative.h"
#include "model/exact_ops.h"
#include "model/log_probs.h"
#include "model/precision.h"
#include "rollout/engine.h"
#include "rollout/engine_sequence.h"

namespace slimpi {
namespace {

// The draws speculation adds beside the sampler's (kernels/counter_rng.h): the draft's
// own, the acceptance tests', the residual's; each a seed per group from the group's.
constexpr uint64_t kDraftStream = 0x6472616674ULL, kAcceptStream = 0x616363657074ULL,
                   kResidualStream = 0x7265736964ULL;

double stream_uniform(uint64_t group_seed, uint64_t stream, int64_t sample, int64_t position) {
  return counter_uniform(mix_seed(group_seed, stream, 0), uint64_t(sample), uint64_t(position));
}

SamplingRow rule_of(const SamplingParams& p) { return {p.temperature, p.top_k, p.top_p, 0.5}; }

// A token from `probs` [V] (the first whose cumulative mass exceeds u · total).
int64_t draw(const float* probs, int64_t vocab, double u) {
  double total = 0;
  for (int64_t v = 0; v < vocab; ++v) total += probs[v];
  double cumulative = 0;
  int64_t last = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    if (probs[v] <= 0) continue;
    last = v;
    cumulative += probs[v];
    if (cumulative > u * total) return v;
  }
  return last;
}

}  // namespace

void Engine::advance_draft_cache(const at::Tensor& hidden, bool after_sampling) {
  Stopwatch clock;
  const int64_t bs = cfg_.block_size, d = model_.config().hidden_size;
  std::vector<int64_t> from_hidden, from_store, into_hidden, into_store;  // source rows -> entry rows
  std::vector<int64_t> next;
  std::vector<CachedSequence> seqs;
  std::vector<std::pair<Sequence*, int64_t>> newest;  // a sequence and the entry row of its newest entry
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  for (auto& up : running_) {
    Sequence& s = *up;
    if (s.row_base < 0) continue;
    // Entries whose next token is known and whose slot is allocated.
    const int64_t known = after_sampling ? s.n_computed
                                         : std::min(s.row_first + s.row_count, int64_t(s.tokens.size()) - 1);
    const int64_t end = std::min(known, int64_t(s.blocks.size()) * bs - 1);
    if (end <= s.mtp_computed) continue;
    std::vector<int64_t> slots;
    for (int64_t m = 0; m < end; ++m) slots.push_back(s.slot(m + 1, bs));
    for (int64_t m = s.mtp_computed; m < end; ++m) {
      const int64_t row = int64_t(next.size());
      if (m >= s.row_first) {
        from_hidden.push_back(s.row_base + m - s.row_first);
        into_hidden.push_back(row);
      } else {  // computed in an earlier forward: the last position of its block, kept
        SLIMPI_CHECK((m + 1) % bs == 0, "engine: the draft's entry {} needs the trunk's state at a position "
                     "computed earlier that is not a block's last", m);
        from_store.push_back(s.blocks[size_t(m / bs)]);
        into_store.push_back(row);
      }
      next.push_back(s.tokens[size_t(m + 1)]);
    }
    seqs.push_back({s.mtp_computed, end - s.mtp_computed, at::tensor(slots, long_opts)});
    s.mtp_computed = end;
    if (after_sampling && end == s.n_computed) newest.emplace_back(&s, int64_t(next.size()) - 1);
  }
  at::Tensor out;  // [R, d] the entries' outputs
  if (!next.empty()) {
    const at::Device device = model_.device();
    at::Tensor in = at::empty({int64_t(next.size()), d}, hidden.options());
    if (!from_hidden.empty())
      in.index_copy_(0, at::tensor(into_hidden, long_opts).to(device),
                     hidden.index_select(0, at::tensor(from_hidden, long_opts).to(device)));
    if (!from_store.empty())
      in.index_copy_(0, at::tensor(into_store, long_opts).to(device),
                     block_last_hidden_.index_select(0, at::tensor(from_store, long_opts).to(device)));
    for (auto& c : seqs) c.slots = c.slots.to(device);
    at::NoGradGuard no_grad;
    ForwardPrecision scope(precision_, device);
    out = model_.forward_mtp_incremental(0, in, at::tensor(next, long_opts).to(device), seqs, cache_);
  }
  if (after_sampling) {
    // Keep the trunk's state at every block's last position this forward computed.
    std::vector<int64_t> rows, blocks;
    for (auto& up : running_) {
      const Sequence& s = *up;
      if (s.row_base < 0) continue;
      for (int64_t p = s.row_first; p < std::min(s.row_first + s.row_count, s.n_computed); ++p)
        if ((p + 1) % bs == 0) {
          rows.push_back(s.row_base + p - s.row_first);
          blocks.push_back(s.blocks[size_t(p / bs)]);
        }
    }
    if (!rows.empty())
      block_last_hidden_.index_copy_(0, at::tensor(blocks, long_opts).to(hidden.device()),
                                     hidden.index_select(0, at::tensor(rows, long_opts).to(hidden.device())));
    stats_.draft_s += clock.seconds();
    draft_chains(newest, out);
    return;
  }
  stats_.draft_s += clock.seconds();
}

void Engine::draft_chains(const std::vector<std::pair<Sequence*, int64_t>>& newest, const at::Tensor& out) {
  Stopwatch clock;
  // Which sequences draft: decoding ones, not done, with room for a chain, while the
  // engine runs few enough of them (rollout.spec_max_running).
  std::vector<Sequence*> chains;
  std::vector<int64_t> lengths, rows;
  const bool crowded = cfg_.spec_max_running > 0 && int64_t(running_.size()) > cfg_.spec_max_running;
  for (auto [s, row] : newest) {
    if (crowded || s->is_group() || s->pending() != 1 || s->n_response() < 1 || finished(*s)) continue;
    const SamplingParams& p = s->request->params;
    const int64_t room = std::min(p.max_new_tokens - s->n_response(),
                                  model_.config().max_seq_len - int64_t(s->tokens.size()));
    const int64_t length = std::min(cfg_.spec_steps, room - 1);  // the verify pass adds a token of its own
    if (length <= 0) continue;
    chains.push_back(s);
    lengths.push_back(length);
    rows.push_back(row);
  }
  if (chains.empty()) return;
  const at::Device device = model_.device();
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  const int64_t V = model_.config().vocab_size, bs = cfg_.block_size;
  at::NoGradGuard no_grad;
  ForwardPrecision scope(precision_, device);
  const SmallBatchLinearScope decode_rows;  // the drafts' LM head over a few rows
  for (Sequence* s : chains) {
    s->draft.clear();
    s->draft_q.clear();
  }
  std::vector<int64_t> live(chains.size());  // chains still drafting, by index
  for (size_t i = 0; i < chains.size(); ++i) live[i] = int64_t(i);
  at::Tensor h = out.index_select(0, at::tensor(rows, long_opts).to(device));  // [C, d]
  for (int64_t j = 0;; ++j) {
    // Step j: draft token j of every live chain from its output h.
    const at::Tensor z = model_.head_logits(h).narrow(1, 0, V).to(at::kFloat).cpu().contiguous();  // [C, V]
    for (size_t c = 0; c < live.size(); ++c) {
      Sequence& s = *chains[size_t(live[c])];
      const SamplingRow rule = rule_of(s.request->params);
      const float* zc = z.data_ptr<float>() + int64_t(c) * V;
      std::vector<float> q(static_cast<size_t>(V));
      sampling_distribution(zc, V, rule, q.data());
      const int64_t position = int64_t(s.tokens.size()) + j;  // of the drafted token
      s.draft.push_back(draw(q.data(), V, stream_uniform(s.request->seed, kDraftStream, s.sample_index, position)));
      if (rule.temperature > 0) s.draft_q.insert(s.draft_q.end(), q.begin(), q.end());
    }
    // Chains with steps left run the depth one position further, on their own output
    // and their newest draft; its entries go to scratch slots.
    std::vector<int64_t> keep, next;
    std::vector<CachedSequence> seqs;
    for (size_t c = 0; c < live.size(); ++c) {
      const int64_t i = live[c];
      Sequence& s = *chains[size_t(i)];
      if (int64_t(s.draft.size()) >= lengths[size_t(i)]) continue;
      keep.push_back(int64_t(c));
      next.push_back(s.draft.back());
      std::vector<int64_t> slots;
      for (int64_t m = 0; m < s.n_computed; ++m) slots.push_back(s.slot(m + 1, bs));
      for (int64_t k = 0; k <= j; ++k) slots.push_back(scratch_slot0_ + i * cfg_.spec_steps + k);
      seqs.push_back({s.n_computed + j, 1, at::tensor(slots, long_opts).to(device)});
    }
    if (keep.empty()) break;
    h = model_.forward_mtp_incremental(0, h.index_select(0, at::tensor(keep, long_opts).to(device)),
                                       at::tensor(next, long_opts).to(device), seqs, cache_);
    std::vector<int64_t> still;
    for (int64_t c : keep) still.push_back(live[size_t(c)]);
    live = std::move(still);
  }
  stats_.draft_s += clock.seconds();
}

void Engine::verify_draft(Sequence& s, const at::Tensor& rows) {
  const int64_t D = int64_t(s.draft.size()), V = model_.config().vocab_size;
  const SamplingParams& params = s.request->params;
  const SamplingRow rule = rule_of(params);
  const at::Tensor z = rows.narrow(1, 0, V).to(at::kFloat).cpu().contiguous();  // [1 + D, V]
  std::vector<double> accept_u, residual_u;
  for (int64_t j = 0; j < D; ++j) {
    const int64_t position = s.n_response() + j;  // response position of the token row j decides
    accept_u.push_back(stream_uniform(s.request->seed, kAcceptStream, s.sample_index, position));
    residual_u.push_back(stream_uniform(s.request->seed, kResidualStream, s.sample_index, position));
  }
  const double bonus_u = counter_uniform(s.request->seed, uint64_t(s.sample_index), uint64_t(s.n_response() + D));
  const ChainVerdict v = verify_chain(z.data_ptr<float>(), s.draft_q.empty() ? nullptr : s.draft_q.data(),
                                      s.draft.data(), D, V, rule, accept_u.data(), residual_u.data(), bonus_u);
  // The policy's log-probs of the tokens, each from its row, as the plain sampler stores them.
  const int64_t k = int64_t(v.tokens.size());
  const double temperature = params.temperature > 0 ? params.temperature : 1.0;
  std::vector<int64_t> support64(v.support.begin(), v.support.end());
  const at::Tensor logp = sampled_token_log_probs(z.narrow(0, 0, k), at::full({k}, float(temperature), z.options()),
                                                  at::tensor(v.tokens, at::kLong), at::tensor(support64, at::kLong));  // [k]
  const int64_t first = s.n_computed;  // the last verified token's position
  int64_t appended = 0;
  bool ended = false;
  for (int64_t i = 0; i < k; ++i) {
    s.tokens.push_back(v.tokens[size_t(i)]);
    s.support.push_back(v.support[size_t(i)]);
    s.log_probs.push_back(logp[i].item<float>());
    s.versions.push_back(weight_version_);
    ++stats_.generated_tokens;
    ++appended;
    if ((ended = finished(s))) break;  // a stop among the accepted drafts ends the response there
  }
  s.n_computed = first + appended;  // the last verified token and the accepted drafts appended
  // Drafts kept: the accepted ones the response took (a stop among them ends it there).
  const int64_t kept = std::min(v.n_accepted, appended);
  if (hybrid() && kept < D && !ended) {
    // The linear layers' state went past the rejected drafts, and a state cannot be cut
    // back: the one from before the chain is restored, and the last verified token and
    // the accepted drafts are computed again with the next forward (their K/V rows are
    // rewritten, equal to round-off; their tokens, log-probs and MoE routing stand, from
    // this verify pass).
    cache_.copy_state(state_snapshot_slot(s.state_slot), s.state_slot);
    s.n_computed = first;
    s.routing_kept_until = first + 1 + kept;
    ++stats_.spec_state_restores;
    stats_.spec_recomputed_tokens += 1 + kept;
  }
  ++stats_.spec_passes;
  stats_.spec_drafted += D;
  stats_.spec_accepted += kept;
  for (int64_t j = 0; j < D; ++j) {
    ++stats_.spec_offered_at[j];
    if (j < kept) ++stats_.spec_accepted_at[j];
  }
  ++s.spec_passes;
  s.spec_drafted += D;
  s.spec_accepted += kept;
  truncate_draft(s, 0);
  trim_blocks(s);
}

void Engine::trim_blocks(Sequence& s) {
  // The rejected drafts' slots: blocks past the pending token's (and the draft entry's
  // after it) go back to the pool.
  const int64_t bs = cfg_.block_size, need = (int64_t(s.tokens.size()) + 1 + bs - 1) / bs;
  while (int64_t(s.blocks.size()) > need) {
    allocator_.unref(s.blocks.back());
    s.blocks.pop_back();
  }
}

}  // namespace slimpi
