// On-policy distillation's top-k term (train.opd_topk_loss_coef): per response token,
// KL(q ‖ p_θ) over the teacher's top-k, Σ_j q_j (log q_j − log p_θ(j)), q the teacher's
// top-k probabilities (renormalised), p_θ the student's softmax at the temperature
// through head_log_probs (one LM-head product per listed token: k per response row; the
// gradient reaches the trunk and the head); reducer-weighted, times the coefficient.
#include <ATen/ATen.h>
#include <slimpi/error.h>

#include <optional>

#include "model/head_log_probs.h"
#include "model/log_probs.h"
#include "model/transformer.h"
#include "train/loss/loss_term.h"
#include "train/metric_sums.h"
#include "train/packed_batch.h"
#include "train/rl_objective.h"
#include "train/trainer_config.h"

namespace slimpi {
namespace {

class OpdTopkTerm final : public LossTerm {
 public:
  OpdTopkTerm(const TrainerConfig& cfg, const Transformer& policy) : cfg_(cfg), policy_(policy) {}
  const char* name() const override { return "opd_topk"; }
  void declare_metrics(MetricSums& sums) const override { sums.add_value("train/opd_topk_kl", 0.0); }
  at::Tensor add_to(at::Tensor loss, const MicroBatchView& mb, MetricSums& sums) const override {
    const at::Device device = policy_.device();
    std::vector<int64_t> ids;
    std::vector<float> q;
    for (int64_t i : mb.which) {
      const Sample& s = mb.local[size_t(i)];
      SLIMPI_CHECK(int64_t(s.teacher_topk_ids.size()) == s.response_length() * cfg_.opd_top_k,
                   "sample (step {}, group {}, index {}) has {} teacher top-k ids for {} tokens x top_k {}", s.step,
                   s.group_index, s.index, s.teacher_topk_ids.size(), s.response_length(), cfg_.opd_top_k);
      ids.insert(ids.end(), s.teacher_topk_ids.begin(), s.teacher_topk_ids.end());
      q.insert(q.end(), s.teacher_topk_probs.begin(), s.teacher_topk_probs.end());
    }
    const at::Tensor& weight = mb.scored.weight;  // [N]
    const PackedBatch& b = mb.batch;
    const int64_t k = cfg_.opd_top_k, N = weight.size(0);
    const at::Tensor rows = response_positions(b.tokens, b.seq_lens, b.prompt_lens).logit_rows;  // [N]
    at::Tensor listed = at::tensor(ids, at::kLong).to(device).view({N, k});                        // [N, k]
    // Context parallelism: mb.hidden is this rank's rows; it scores the tokens they
    // predict, and the group gathers every row's (train/packed_batch.h).
    const auto split = policy_.context_split(b.seq_lens);
    const std::optional<ContextSplit::Items> it = split ? std::optional(split->items(rows)) : std::nullopt;
    const at::Tensor mine = it ? it->local_rows : rows;
    if (it) listed = listed.index_select(0, it->local_items);
    at::Tensor logp = head_log_probs(mb.hidden, policy_.lm_head(), {mine.repeat_interleave(k), listed.reshape({-1})},
                                     cfg_.temperature, false, {}, vocab_shard_of(policy_),
                                     cfg_.precision == Precision::BF16)
                          .logp.view({mine.size(0), k});
    if (it) logp = split->gather_items(*it, logp);  // [N, k]
    const at::Tensor qt = at::tensor(q, at::kFloat).to(device).view({N, k});
    const at::Tensor kl = (qt * (qt.clamp_min(1e-30).log() - logp)).sum(1);  // [N]
    sums.add("train/opd_topk_kl", kl, weight);
    return loss + cfg_.opd_topk_loss_coef * (kl * weight).sum();
  }

 private:
  const TrainerConfig& cfg_;
  const Transformer& policy_;
};

}  // namespace

std::unique_ptr<LossTerm> make_opd_topk_term(const TrainerConfig& cfg, const Transformer& policy) {
  return std::make_unique<OpdTopkTerm>(cfg, policy);
}

}  // namespace slimpi
