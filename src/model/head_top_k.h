// head_top_k — a model's next-token distribution at some rows of its LM head's input,
// cut to its k most likely tokens (no gradient): what a draft distils (train/mtp_loss.h)
// and what a teacher hands its student (on-policy distillation's top-k loss).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <utility>

namespace slimpi {

class Transformer;

// hidden [T, d] (the final norm's output), rows [N] int64 -> ids [N, k] (whole-vocabulary
// ids, most likely first) and q [N, k]: softmax(z / temperature) renormalised over them.
// Only ids below vocab_limit compete (a teacher whose vocabulary has more rows than its
// student's: the student has no row for the others), nor the padded rows of a shard.
// Under tensor parallelism each shard's k largest are gathered and the k largest of those
// kept. Rows a chunk at a time: at most ~2^22 logits exist at once.
std::pair<at::Tensor, at::Tensor> head_top_k(const Transformer& model, const at::Tensor& hidden, const at::Tensor& rows,
                                             int64_t k, double temperature,
                                             int64_t vocab_limit = std::numeric_limits<int64_t>::max());

}  // namespace slimpi
