// Token log-probs and entropies from logits sharded over the vocabulary (tensor
// parallelism: each rank of the group holds columns [begin, begin + Vl) of the padded
// vocabulary, the first n_real of them real tokens). The same definitions as
// model/log_probs.h, computed without ever joining the vocabulary (slime's
// _VocabParallelLogProbEntropy, Megatron's vocab-parallel cross-entropy):
//   m    = max over every shard of z            (all-reduce max)
//   S    = Σ over every shard of exp(z − m)     (one all-reduce sum, with the two below)
//   z_t  = the target's logit, from the shard that holds it (0 elsewhere, summed)
//   Σp·z = Σ over every shard of exp(z − m)·z / S
//   logp = z_t − m − log S,  entropy = m + log S − Σp·z
// Backward is analytic, recomputing p = exp(z − m − log S) per chunk:
//   ∂logp/∂z_j = [j = t] − p_j,   ∂entropy/∂z_j = −p_j (log p_j + entropy)
// Rows are processed in chunks of about kChunkElements logits, so the temporaries (p,
// exp, masks) never span [N, Vl] at once. Padded columns are −inf: they carry no
// probability and get zero gradient. A token drawn with top-k/top-p (support k > 0) is
// scored against the k largest entries of z over the whole vocabulary: each shard's k
// largest are gathered (the global k largest are among them) and the log-sum-exp taken
// over the largest k of those, with autograd through the gather.
// Collective over the group in forward and in backward.
#pragma once

#include <ATen/core/Tensor.h>

#include "model/log_probs.h"

namespace slimpi {

class Comm;

struct VocabShard {
  Comm* comm = nullptr;     // the tensor-parallel group
  int64_t begin = 0;        // first vocabulary id of this shard's columns
  int64_t n_real = 0;       // of this shard's columns, the real tokens (the rest are padding)
};

// Temporaries per chunk of rows, in logits, and the rows of a chunk of `columns` logits each.
constexpr int64_t kVocabParallelChunkElements = int64_t(1) << 22;
int64_t chunk_rows(int64_t columns);

// The pieces the chunked functions share (this file's and model/head_log_probs.h's), on
// one chunk of n rows. z [n, Vl] fp32 with the padded columns at −inf (mask_padding);
// comm null: the whole vocabulary on this rank.
at::Tensor mask_padding(const at::Tensor& z, int64_t n_real);
struct ChunkStatistics {
  at::Tensor m, log_s, logp, entropy;  // [n] each, the same on every rank of comm
};
ChunkStatistics chunk_statistics(const at::Tensor& z, const at::Tensor& targets, Comm* comm, int64_t begin,
                                 int64_t n_real);
// ∂(Σ g_logp·logp + Σ g_entropy·entropy)/∂z for the chunk (m, log_s, entropy its statistics).
at::Tensor chunk_gradient(const at::Tensor& z, const at::Tensor& m, const at::Tensor& log_s, const at::Tensor& entropy,
                          const at::Tensor& g_logp, const at::Tensor& g_entropy, const at::Tensor& targets,
                          int64_t begin, int64_t n_real);

// logits [T, Vl] (this shard's columns) -> as score_tokens (model/log_probs.h).
TokenLogProbs score_tokens_vocab_parallel(const at::Tensor& logits, const ScoredPositions& at, double temperature,
                                          bool with_entropy, const at::Tensor& support, const VocabShard& shard);

}  // namespace slimpi
