#include "model/vocab_parallel_log_probs.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>

#include "parallel/comm.h"
#include "parallel/comm_tensor.h"
#include "parallel/tp_mappings.h"

namespace slimpi {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The local column of each target, and whether this shard holds it.
struct LocalTargets {
  at::Tensor column;  // [n] int64 (0 where elsewhere)
  at::Tensor here;    // [n] bool
};
LocalTargets local_targets(const at::Tensor& targets, int64_t begin, int64_t n_real) {
  const at::Tensor local = targets - begin;
  const at::Tensor here = local.ge(0).logical_and(local.lt(n_real));
  return {local.masked_fill(here.logical_not(), 0), here};
}

struct VocabParallelLogProbEntropy : public torch::autograd::Function<VocabParallelLogProbEntropy> {
  // z [N, Vl] fp32 (divided by the temperature), targets [N] -> {logp [N], entropy [N]}.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& z, const at::Tensor& targets, Comm* comm,
                               int64_t begin, int64_t n_real) {
    const int64_t N = z.size(0), step = chunk_rows(z.size(1));
    at::Tensor m = at::empty({N}, z.options()), log_s = at::empty({N}, z.options());
    at::Tensor logp = at::empty({N}, z.options()), entropy = at::empty({N}, z.options());
    for (int64_t r = 0; r < N; r += step) {
      const int64_t n = std::min(step, N - r);
      const ChunkStatistics c =
          chunk_statistics(mask_padding(z.narrow(0, r, n), n_real), targets.narrow(0, r, n), comm, begin, n_real);
      m.narrow(0, r, n).copy_(c.m);
      log_s.narrow(0, r, n).copy_(c.log_s);
      logp.narrow(0, r, n).copy_(c.logp);
      entropy.narrow(0, r, n).copy_(c.entropy);
    }
    ctx->save_for_backward({z, targets, m, log_s, entropy});
    ctx->saved_data["begin"] = begin;
    ctx->saved_data["n_real"] = n_real;
    return {logp, entropy};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &z = saved[0], &targets = saved[1], &m = saved[2], &log_s = saved[3], &entropy = saved[4];
    const int64_t begin = ctx->saved_data["begin"].toInt(), n_real = ctx->saved_data["n_real"].toInt();
    const at::Tensor g_logp = grads[0].defined() ? grads[0] : at::zeros_like(m);
    const at::Tensor g_ent = grads[1].defined() ? grads[1] : at::zeros_like(m);
    const int64_t N = z.size(0), step = chunk_rows(z.size(1));
    at::Tensor dz = at::empty_like(z);
    for (int64_t r = 0; r < N; r += step) {
      const int64_t n = std::min(step, N - r);
      dz.narrow(0, r, n).copy_(chunk_gradient(mask_padding(z.narrow(0, r, n), n_real), m.narrow(0, r, n),
                                              log_s.narrow(0, r, n), entropy.narrow(0, r, n), g_logp.narrow(0, r, n),
                                              g_ent.narrow(0, r, n), targets.narrow(0, r, n), begin, n_real));
    }
    return {dz, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// logp against the k largest entries of z over the whole vocabulary (k = support[i] > 0;
// rows with support 0 get `full`).
at::Tensor truncated_log_probs(const at::Tensor& z, const at::Tensor& targets, const at::Tensor& support,
                               const VocabShard& shard, const at::Tensor& full) {
  Comm* comm = shard.comm;
  const int64_t k_max = std::max<int64_t>(1, support.max().item<int64_t>());
  const at::Tensor zm = mask_padding(z, shard.n_real);
  const int64_t k_local = std::min<int64_t>(k_max, zm.size(1));
  at::Tensor top = std::get<0>(zm.topk(k_local, 1, /*largest=*/true, /*sorted=*/true));  // [N, k_local]
  at::Tensor candidates = gather_from_tp(comm, top);                                          // [N, t·k_local]
  at::Tensor sorted = std::get<0>(candidates.sort(1, /*descending=*/true));
  const at::Tensor k = at::where(support.gt(0), support, at::full_like(support, sorted.size(1)));
  const at::Tensor outside = at::arange(sorted.size(1), support.options()).unsqueeze(0).ge(k.unsqueeze(1));
  const at::Tensor lse = at::logsumexp(sorted.masked_fill(outside, -INFINITY), 1);  // [N]
  const LocalTargets t = local_targets(targets, shard.begin, shard.n_real);
  const at::Tensor zt = reduce_from_tp(
      comm, z.gather(1, t.column.unsqueeze(1)).squeeze(1) * t.here.to(z.scalar_type()));  // [N]
  return at::where(support.gt(0), zt - lse, full);
}

}  // namespace

int64_t chunk_rows(int64_t columns) {
  return std::max<int64_t>(1, kVocabParallelChunkElements / std::max<int64_t>(columns, 1));
}

at::Tensor mask_padding(const at::Tensor& z, int64_t n_real) {
  if (n_real == z.size(1)) return z;
  const at::Tensor padding = at::arange(z.size(1), z.options().dtype(at::kLong)).ge(n_real);  // [Vl]
  return z.masked_fill(padding.unsqueeze(0), -INFINITY);
}

ChunkStatistics chunk_statistics(const at::Tensor& z, const at::Tensor& targets, Comm* comm, int64_t begin,
                                 int64_t n_real) {
  at::Tensor m = std::get<0>(z.max(1)).contiguous();  // [n]
  if (comm) allreduce(*comm, m, ReduceOp::Max);
  const at::Tensor e = at::exp(z - m.unsqueeze(1));  // [n, Vl], 0 at padding
  const LocalTargets t = local_targets(targets, begin, n_real);
  const at::Tensor zt = z.gather(1, t.column.unsqueeze(1)).squeeze(1).masked_fill(t.here.logical_not(), 0.0);
  const at::Tensor ez = (e * at::where(e.gt(0), z, at::zeros_like(z))).sum(1);  // Σ e·z, finite
  at::Tensor sums = at::stack({e.sum(1), zt, ez}).contiguous();                   // [3, n]
  if (comm) allreduce(*comm, sums);
  const at::Tensor log_s = sums[0].log();
  return {m, log_s, sums[1] - m - log_s, m + log_s - sums[2] / sums[0]};
}

at::Tensor chunk_gradient(const at::Tensor& z, const at::Tensor& m, const at::Tensor& log_s, const at::Tensor& entropy,
                          const at::Tensor& g_logp, const at::Tensor& g_entropy, const at::Tensor& targets,
                          int64_t begin, int64_t n_real) {
  const at::Tensor log_p = z - (m + log_s).unsqueeze(1);  // [n, Vl], −inf at padding
  const at::Tensor p = log_p.exp();
  const at::Tensor finite_log_p = at::where(p.gt(0), log_p, at::zeros_like(log_p));
  // −g_logp·p − g_entropy·p·(log p + H), then +g_logp at the target's column here.
  at::Tensor d = -p * (g_logp.unsqueeze(1) + g_entropy.unsqueeze(1) * (finite_log_p + entropy.unsqueeze(1)));
  const LocalTargets t = local_targets(targets, begin, n_real);
  d.scatter_add_(1, t.column.unsqueeze(1), (g_logp * t.here.to(d.scalar_type())).unsqueeze(1));
  return d;
}

TokenLogProbs score_tokens_vocab_parallel(const at::Tensor& logits, const ScoredPositions& at, double temperature,
                                          bool with_entropy, const at::Tensor& support, const VocabShard& shard) {
  SLIMPI_CHECK(shard.comm, "vocab-parallel log-probs without the tensor-parallel group");
  at::Tensor z = logits.index_select(0, at.logit_rows).to(at::kFloat);  // [N, Vl]
  if (temperature != 1.0) z = z / temperature;
  variable_list out = VocabParallelLogProbEntropy::apply(z, at.targets, shard.comm, shard.begin, shard.n_real);
  TokenLogProbs r;
  r.logp = out[0];
  if (with_entropy) r.entropy = out[1];
  if (any_truncated(support)) r.logp = truncated_log_probs(z, at.targets, support, shard, r.logp);
  return r;
}

}  // namespace slimpi
