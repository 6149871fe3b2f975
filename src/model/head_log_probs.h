// Token log-probs and entropies straight from the LM head's input: the head's product
// is taken inside, a chunk of rows at a time, so that no [T, V] (nor, for the scored
// rows, [N, V]) tensor of logits exists at once — in forward or in backward. The
// trainer's loss path (train/packed_batch.h) uses it with or without tensor parallelism.
//
// hidden [T, d] fp32 (the final norm's output), head [Vl, d] (the LM head's weight, or
// this tensor-parallel shard's rows of it); the scored rows N = at.logit_rows. Per
// chunk of rows: z = hidden_rows · headᵀ / temperature (in bf16 when `bf16`, as the
// autocast product would, then fp32), padded vocabulary columns −inf, and the
// statistics of model/vocab_parallel_log_probs.h (all-reduced over the tensor group):
//   logp = z_t − m − log S,   entropy = m + log S − Σp·z
// Backward recomputes each chunk's z and p:
//   dz = g_logp·([j = t] − p) − g_entropy·p·(log p + entropy)   (then / temperature)
//   ∂hidden_rows = dz · head,   ∂head += dzᵀ · hidden_rows
// (fp32 products of the operands as the forward used them). Tokens drawn with top-k /
// top-p (support > 0 anywhere in the batch) are scored the unfused way: the scored rows'
// logits are formed whole and go through score_tokens / its vocab-parallel form.
#pragma once

#include <ATen/core/Tensor.h>

#include "model/log_probs.h"
#include "model/vocab_parallel_log_probs.h"

namespace slimpi {

// shard.comm null: the whole vocabulary on this rank (begin 0, n_real = head rows).
TokenLogProbs head_log_probs(const at::Tensor& hidden, const at::Tensor& head, const ScoredPositions& at,
                             double temperature, bool with_entropy, const at::Tensor& support,
                             const VocabShard& shard, bool bf16);

}  // namespace slimpi
