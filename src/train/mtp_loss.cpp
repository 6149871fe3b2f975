#include "train/mtp_loss.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>

#include <fmt/format.h>

#include <optional>
#include <tuple>

#include "model/head_log_probs.h"
#include "model/head_top_k.h"
#include "model/transformer.h"
#include "parallel/comm_tensor.h"
#include "parallel/tp_mappings.h"
#include "train/metric_sums.h"
#include "train/packed_batch.h"

namespace slimpi {
namespace {

bool counts(const std::vector<float>& mask, int64_t r) { return mask.empty() || mask[size_t(r)] > 0.0f; }

}  // namespace

double mtp_counted_positions(int64_t prompt_length, int64_t length, const std::vector<float>& mask, int64_t depth) {
  double n = 0;
  // target at local position q, input at q - 1 (a response token: q - 1 >= P), read at
  // position q - depth - 2 >= 0
  for (int64_t q = std::max(prompt_length + 1, depth + 2); q < length; ++q)
    if (counts(mask, q - 1 - prompt_length) && counts(mask, q - prompt_length)) n += 1;
  return n;
}

void declare_mtp_metrics(int64_t n_depths, MetricSums& sums) {
  sums.add_value("train/mtp_loss", 0.0);
  for (int64_t i = 0; i < n_depths; ++i) sums.add_value(fmt::format("train/mtp_{}_loss", i + 1), 0.0);
}

at::Tensor mtp_loss(const Transformer& model, const PackedBatch& b, const at::Tensor& hidden,
                    const std::vector<at::Tensor>& masks, const MtpLossSpec& spec, MetricSums& sums) {
  const int64_t k = model.n_mtp_layers();
  SLIMPI_CHECK(int64_t(spec.n_counted.size()) == k, "MTP loss: counts for {} depths, the model has {}",
               spec.n_counted.size(), k);
  SLIMPI_CHECK(masks.size() == b.seq_lens.size(), "MTP loss: {} masks for {} sequences", masks.size(), b.seq_lens.size());
  const at::Device device = model.device();
  const at::Tensor tokens = b.tokens.cpu().contiguous();  // [T]
  const int64_t* x = tokens.data_ptr<int64_t>();
  const int64_t T = tokens.size(0);
  std::vector<std::vector<float>> host_masks;
  for (const auto& m : masks) {
    const at::Tensor h = m.to(at::kFloat).cpu().contiguous();
    host_masks.emplace_back(h.data_ptr<float>(), h.data_ptr<float>() + h.numel());
  }
  const TensorShard& tp = model.tensor_shard();
  const VocabShard shard = tp.size > 1 ? VocabShard{tp.comm, model.vocab_begin(), model.n_real_vocab()} : VocabShard{};
  const at::Tensor head = model.lm_head().detach();
  const auto split = model.context_split(b.seq_lens);  // null without context parallelism
  const at::Tensor trunk = hidden.detach();
  at::Tensor in = trunk;
  at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
  for (int64_t i = 0; i < k; ++i) {
    // next[j] = x[j + i + 1] within j's sequence (0 past its end: such rows never count);
    // the counted rows and their targets x[j + i + 2].
    std::vector<int64_t> next(size_t(T), 0), rows, targets;
    int64_t start = 0;
    for (size_t s = 0; s < b.seq_lens.size(); ++s) {
      const int64_t L = b.seq_lens[s], P = b.prompt_lens[s];
      for (int64_t p = 0; p + i + 1 < L; ++p) next[size_t(start + p)] = x[start + p + i + 1];
      for (int64_t q = std::max(P + 1, i + 2); q < L; ++q)
        if (counts(host_masks[s], q - 1 - P) && counts(host_masks[s], q - P)) {
          rows.push_back(start + q - i - 2);
          targets.push_back(x[start + q]);
        }
      start += L;
    }
    at::Tensor h;  // [T, d] depth i's output
    {
      ForwardPrecision scope(spec.precision, device);
      h = model.forward_mtp_packed(i, in, at::tensor(next, at::kLong).to(device), b.seq_lens);
    }
    in = h;
    if (rows.empty()) {
      // Nothing to count, but the depth stays in the backward (with a zero): under expert
      // parallelism its MoE exchanges' backward must meet the other ranks'.
      total = total + h.sum() * 0.0;
      continue;
    }
    // Under tensor parallelism each shard's head gives its part of the gradient of h: the
    // head's branch enters through copy_to_tp, which sums them (the trunk's final norm does
    // the same); the next depth's branch reads h as every rank holds it.
    const at::Tensor head_in = tp.size > 1 ? copy_to_tp(tp.comm, h) : h;
    const at::Tensor r = at::tensor(rows, at::kLong).to(device), t = at::tensor(targets, at::kLong).to(device);
    const int64_t N = r.size(0);
    // Context parallelism: h and the trunk are this rank's rows; each rank scores the rows
    // it holds and the group gathers them (train/packed_batch.h's log-probs likewise).
    const std::optional<ContextSplit::Items> it = split ? std::optional(split->items(r)) : std::nullopt;
    const at::Tensor r_mine = it ? it->local_rows : r;
    const at::Tensor t_mine = it ? t.index_select(0, it->local_items) : t;
    const int64_t n_mine = r_mine.size(0);
    at::Tensor per_row;  // [N]
    if (spec.kind == "distill") {
      // The policy's distribution over its top-k at the target, from the trunk at the row
      // that predicts it (row + i + 1), against the depth's log-probs of those tokens.
      at::Tensor ids, q;  // [n_mine, kk] each
      if (!split) {
        std::tie(ids, q) = head_top_k(model, trunk, r + (i + 1), spec.distill_top_k, 1.0);
      } else {  // the trunk row's holder takes its top-k; gathered, then this rank's rows
        const ContextSplit::Items at_trunk = split->items(r + (i + 1));
        auto [ids_there, q_there] = head_top_k(model, trunk, at_trunk.local_rows, spec.distill_top_k, 1.0);
        ids = split->gather_items(at_trunk, ids_there).index_select(0, it->local_items);
        q = split->gather_items(at_trunk, q_there.detach()).index_select(0, it->local_items);
      }
      const int64_t kk = ids.size(1);
      const TokenLogProbs lp = head_log_probs(head_in, head, {r_mine.repeat_interleave(kk), ids.reshape({-1})}, 1.0,
                                              false, {}, shard, spec.precision == Precision::BF16);
      per_row = -(lp.logp.view({n_mine, kk}) * q).sum(1);
    } else {
      per_row = -head_log_probs(head_in, head, {r_mine, t_mine}, 1.0, false, {}, shard,
                                spec.precision == Precision::BF16).logp;
    }
    if (it) per_row = split->gather_items(*it, per_row);  // [N]
    const double n_i = std::max(spec.n_counted[size_t(i)], 1.0);
    const at::Tensor w = at::full({N}, 1.0 / n_i, per_row.options());
    total = total + (per_row * w).sum() / double(k);
    sums.add(fmt::format("train/mtp_{}_loss", i + 1), per_row, w);
    sums.add("train/mtp_loss", per_row, w / double(k));
  }
  return total * spec.coef;
}

}  // namespace slimpi
