// Causal self-attention of packed sequences (no padding in the input: the tokens of B
// sequences back to back, T in all), for both forwards of the Transformer:
//   packed       full sequences, positions from 0, block-diagonal causal (training)
//   incremental  the new tokens of B sequences against their cached past (KvCache)
// Three ways to compute it, the same outputs (and gradients) to fp32 round-off (tested):
//   padded     queries and keys scattered into [B, L, heads, D], masked (causal and
//              past each sequence's end), gathered back: a few large ops, fastest for
//              many short sequences; O(B · H · Lq · Lk) scores
//   unpadded   each sequence alone through torch's scaled_dot_product_attention (a
//              flash kernel: no padding, no O(B · longest²) scores), chosen once the
//              padded scores would exceed the padded-attention budget
//   paged      decode rows (one new token each) read K/V where they lie in the cache
//              (kernels/paged_attention.h), per DecodeAttention
// Grouped-query everywhere: head h reads kv head h / (H / Hkv).
// Shapes: T packed tokens, B sequences, H heads, Hkv key/value heads, D head dim,
// Lq / Lk the longest query and key lengths of the batch.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace slimpi {

struct KvCache;
class ContextSplit;

// How the decode rows of an incremental batch read the cache:
//   Paged        the host paged-attention kernel reads each K/V row where it lies
//   Gather       the rows are gathered into the KvCache's reused buffer, then one
//                batched attention (any device)
//   FreshGather  a new padded copy of every sequence's history, per layer and step
//                (the code before the paged kernel; kept for perf/ to compare against)
//   Auto         Paged for an fp32 forward on the CPU; otherwise Gather (a bf16 forward
//                then runs the attention ops a bf16 trainer runs)
enum class DecodeAttention { Auto, Paged, Gather, FreshGather };

// Where each token of a packed batch sits in the padded attention batch and where its
// keys come from. Token t is query row (b_of_t[t], j_of_t[t]).
struct AttentionLayout {
  int64_t n_seqs = 0, max_new = 0, max_keys = 0;
  at::Tensor b_of_t, j_of_t;  // [T]
  at::Tensor positions;       // [T] absolute position of every token
  at::Tensor q_pos;           // [B, max_new] absolute position of every padded query
  at::Tensor n_keys;          // [B] keys each sequence attends to (past + new)
  at::Tensor new_slots;       // cached: [T] cache slot of every new token
  at::Tensor key_slots;       // cached: [B * max_keys] slot of every padded key (0 where padding)
  std::vector<int64_t> seq_lens;  // packed (no cache): each sequence's length
  std::vector<int64_t> n_past_host, n_new_host;  // [B] each, on the host
  std::vector<int64_t> state_slots;              // cached, hybrid models: [B] each sequence's state slot
  // Incremental batches holding both decode (one new token) and prefill sequences: the
  // two attend in separate calls, so decode rows are never padded to a prefill chunk.
  // Each part: its own layout over its sequences, and token_index [T_part], the rows of
  // the packed batch its tokens are.
  struct Part;
  std::vector<Part> parts;
  // Context parallelism (model/context_split.h): the queries are this rank's chunks, each
  // a "sequence" of the layout (n_past its first position, n_keys its end), and every key
  // of their sequences comes from the group (ContextSplit::gather_rows). key_rows
  // [B · max_keys]: the packed row of each chunk's keys (0 past n_keys).
  std::shared_ptr<const ContextSplit> context;
  at::Tensor key_rows;
};

struct AttentionLayout::Part {
  AttentionLayout layout;
  at::Tensor token_index;
};

// B sequences of seq_lens tokens each, positions from 0, no cache.
AttentionLayout packed_layout(const std::vector<int64_t>& seq_lens, const at::Device& device);
// B cached sequences (their past in the cache at `slots`); split_decode_and_prefill:
// decode rows and prefill chunks of one batch attend apart (AttentionLayout::parts).
struct CachedSequence;
AttentionLayout incremental_layout(const std::vector<CachedSequence>& seqs, bool split_decode_and_prefill,
                                   const at::Device& device);

// This rank's chunks of a context-parallel split, positions within their sequences.
AttentionLayout context_layout(std::shared_ptr<const ContextSplit> split, const at::Device& device);

// What picks the way attention is computed for one forward.
struct AttentionPlan {
  int64_t padded_budget = 0;  // padded scores (B · H · Lq · Lk) above which sequences attend unpadded
  DecodeAttention decode = DecodeAttention::Gather;  // resolved (never Auto)
};

// One layer's attention over the batch: q [T, H, D], k/v [T, Hkv, D] (RoPE applied)
// -> [T, H * D]. With a cache, first writes k/v at layout.new_slots of layer `layer`,
// then attends to every cached key of each sequence.
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionLayout& layout,
                  KvCache* cache, int64_t layer, const AttentionPlan& plan);

// The building blocks (exposed for tests and benchmarks).
// q [B, Lq, H, D], k/v [B, Lk, Hkv, D]; query j of sequence b sits at position
// q_pos[b][j] and sees keys 0..q_pos[b][j] that exist (key index < n_keys[b]).
// Returns [B, Lq, H, D].
at::Tensor attend_padded(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& q_pos,
                         const at::Tensor& n_keys);
// q [Lq, H, D]: the queries at positions n_past..n_past+Lq-1; k/v [n_past + Lq, Hkv, D].
// Returns [Lq, H, D].
at::Tensor attend_one_sequence(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t n_past);

}  // namespace slimpi
