#include "model/head_log_probs.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>

#include "kernels/batch_invariant.h"
#include "kernels/small_batch_linear.h"
#include "model/exact_ops.h"
#include "parallel/comm.h"
#include "parallel/comm_tensor.h"
#include "parallel/tp_mappings.h"

namespace slimpi {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Shape {
  Comm* comm;  // null: one rank
  int64_t begin, n_real;
  double temperature;
  bool bf16;
};

// h [n, d] · headᵀ -> [n, Vl] fp32, in bf16 when `bf16` (as autocast's product).
at::Tensor head_product(const at::Tensor& h, const at::Tensor& head, bool bf16) {
  return bf16 ? at::matmul(h.to(at::kBFloat16), head.to(at::kBFloat16).t()).to(at::kFloat)
              : at::matmul(h, head.to(at::kFloat).t());
}

// z [n, Vl] fp32 of the rows h [n, d]: the head's product, / temperature, padding at −inf.
at::Tensor chunk_logits(const at::Tensor& h, const at::Tensor& head, const Shape& s) {
  at::Tensor z = head_product(h, head, s.bf16);
  if (s.temperature != 1.0) z = z / s.temperature;
  return mask_padding(z, s.n_real);
}

// Exact numerics with a vocab-parallel head: the vocabulary's size (every shard's real
// columns), and every shard's columns of the rows' logits, [n, Vl] -> [n, V] (the padded
// shards' first `vocab` columns), what a tensor-parallel engine gathers before it samples
// (rollout/engine_group.h). gather_from_tp: differentiable where the caller needs it.
int64_t whole_vocabulary_size(Comm* comm, int64_t n_real) {
  if (comm) comm->allreduce(&n_real, 1, DType::I64, ReduceOp::Sum);
  return n_real;
}
at::Tensor whole_vocabulary(const at::Tensor& z_shard, Comm* comm, int64_t vocab) {
  return comm ? gather_from_tp(comm, z_shard).narrow(1, 0, vocab) : z_shard;
}

struct HeadLogProbEntropy : public torch::autograd::Function<HeadLogProbEntropy> {
  // rows [N, d] fp32, head [Vl, d], targets [N] -> {logp [N], entropy [N]}.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& head,
                               const at::Tensor& targets, Comm* comm, int64_t begin, int64_t n_real,
                               double temperature, bool bf16) {
    const Shape s{comm, begin, n_real, temperature, bf16};
    const bool exact = exact_numerics();
    const int64_t vocab = exact ? whole_vocabulary_size(comm, n_real) : n_real;
    const int64_t N = rows.size(0), step = chunk_rows(head.size(0));
    const at::TensorOptions fp32 = rows.options().dtype(at::kFloat);
    at::Tensor m = at::empty({N}, fp32), log_s = at::empty({N}, fp32), logp = at::empty({N}, fp32),
               entropy = at::empty({N}, fp32);
    for (int64_t r = 0; r < N; r += step) {
      const int64_t n = std::min(step, N - r);
      const at::Tensor h = rows.narrow(0, r, n);
      // Exact numerics: the batch-invariant product and the one log-prob definition the
      // engine samples with (model/exact_ops.h); the statistics the backward reads are
      // the same z's.
      const at::Tensor z_raw = exact ? exact_dense(h, head, {}, bf16).to(at::kFloat) : at::Tensor();  // [n, V]
      const ChunkStatistics c = chunk_statistics(exact ? mask_padding(temperature != 1.0 ? z_raw / temperature : z_raw, n_real)
                                                       : chunk_logits(h, head, s),
                                                 targets.narrow(0, r, n), comm, begin, n_real);
      m.narrow(0, r, n).copy_(c.m);
      log_s.narrow(0, r, n).copy_(c.log_s);
      logp.narrow(0, r, n).copy_(exact ? token_log_probs_rows(whole_vocabulary(z_raw, comm, vocab),
                                                                at::full({n}, float(temperature), fp32),
                                                                targets.narrow(0, r, n), {})
                                       : c.logp);
      entropy.narrow(0, r, n).copy_(c.entropy);
    }
    ctx->save_for_backward({rows, head, targets, m, log_s, entropy});
    ctx->saved_data["comm"] = reinterpret_cast<int64_t>(comm);
    ctx->saved_data["begin"] = begin;
    ctx->saved_data["n_real"] = n_real;
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["bf16"] = bf16;
    return {logp, entropy};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto v = ctx->get_saved_variables();
    const at::Tensor &rows = v[0], &head = v[1], &targets = v[2], &m = v[3], &log_s = v[4], &entropy = v[5];
    const Shape s{reinterpret_cast<Comm*>(ctx->saved_data["comm"].toInt()), ctx->saved_data["begin"].toInt(),
                  ctx->saved_data["n_real"].toInt(), ctx->saved_data["temperature"].toDouble(),
                  ctx->saved_data["bf16"].toBool()};
    const at::Tensor g_logp = grads[0].defined() ? grads[0] : at::zeros_like(m);
    const at::Tensor g_ent = grads[1].defined() ? grads[1] : at::zeros_like(m);
    const int64_t N = rows.size(0), step = chunk_rows(head.size(0));
    // The operands as the forward's product used them, in fp32.
    const at::Tensor head_used = s.bf16 ? head.to(at::kBFloat16).to(at::kFloat) : head.to(at::kFloat);
    at::Tensor d_rows = at::zeros_like(rows), d_head = at::zeros(head.sizes(), rows.options().dtype(at::kFloat));
    for (int64_t r = 0; r < N; r += step) {
      const int64_t n = std::min(step, N - r);
      const at::Tensor h = rows.narrow(0, r, n);
      at::Tensor dz = chunk_gradient(chunk_logits(h, head, s), m.narrow(0, r, n), log_s.narrow(0, r, n),
                                     entropy.narrow(0, r, n), g_logp.narrow(0, r, n), g_ent.narrow(0, r, n),
                                     targets.narrow(0, r, n), s.begin, s.n_real);
      if (s.temperature != 1.0) dz = dz / s.temperature;
      const at::Tensor h_used = s.bf16 ? h.to(at::kBFloat16).to(at::kFloat) : h;
      d_rows.narrow(0, r, n).copy_(at::matmul(dz, head_used));
      d_head.addmm_(dz.t(), h_used);
    }
    return {d_rows, d_head.to(head.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

TokenLogProbs head_log_probs(const at::Tensor& hidden, const at::Tensor& head, const ScoredPositions& at,
                             double temperature, bool with_entropy, const at::Tensor& support,
                             const VocabShard& shard, bool bf16) {
  const at::Tensor rows = hidden.index_select(0, at.logit_rows);  // [N, d]
  if (any_truncated(support)) {
    // The scored rows' logits, whole (the top-k / top-p support needs each row's largest).
    if (exact_numerics()) {  // the engine's definition (model/exact_ops.h); entropy as below
      // [N, V]: the whole rows, as a tensor-parallel engine gathers them (a bf16 forward's
      // logits rounded to bf16, as the engine's head gives them)
      const at::Tensor logits = whole_vocabulary(exact_dense(rows, head, {}, bf16).to(at::kFloat), shard.comm,
                                                 whole_vocabulary_size(shard.comm, shard.comm ? shard.n_real : 0));
      TokenLogProbs r;
      r.logp = sampled_token_log_probs(logits, at::full({rows.size(0)}, float(temperature), logits.options()),
                                       at.targets, support);
      if (with_entropy) {
        ScoredPositions all = at;
        all.logit_rows = at::arange(rows.size(0), at.logit_rows.options());
        r.entropy = score_tokens(logits, all, temperature, true, support).entropy;
      }
      return r;
    }
    const at::Tensor logits = head_product(rows, head, bf16);
    ScoredPositions all = at;
    all.logit_rows = at::arange(rows.size(0), at.logit_rows.options());
    if (!shard.comm) return score_tokens(logits, all, temperature, with_entropy, support);
    return score_tokens_vocab_parallel(logits, all, temperature, with_entropy, support, shard);
  }
  const int64_t n_real = shard.comm ? shard.n_real : head.size(0);
  variable_list out = HeadLogProbEntropy::apply(rows, head, at.targets, shard.comm, shard.comm ? shard.begin : 0,
                                                n_real, temperature, bf16);
  TokenLogProbs r;
  r.logp = out[0];
  if (with_entropy) r.entropy = out[1];
  return r;
}

}  // namespace slimpi
