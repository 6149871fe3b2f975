// The multi-token-prediction loss (model.mtp_num_layers = k > 0, train.mtp_loss_coef > 0):
// the MTP depths trained beside the policy, as slime trains them with Megatron
// (--enable-mtp-training, --mtp-loss-scaling-factor), so that the rollout's draft
// (rollout.speculative = "mtp") follows the policy as it moves.
//
// Depth i (0-based) at the packed position of local position p of a sequence reads the
// previous depth's output there (depth 0: the trunk's final-norm output, detached) and
// the embedding of x[p + i + 1], and its logits z = h_i · Wᵀ (the LM head, detached)
// predict x[p + i + 2]. A position counts where the input token x[p + i + 1] and the target
// x[p + i + 2] are both generated response tokens with loss mask 1 (never across packed
// sequences: the positions of one sequence only). Per counted position:
//   "ce"       −log softmax(z)[x[p + i + 2]]
//   "distill"  −Σ_{v ∈ top-k} q_v · log softmax(z)[v], q the policy's own next-token
//              distribution at that target (its logits at position p + i + 1, detached),
//              renormalised over its k largest (SkyRL's draft distillation)
// L = coef · (1/k) Σ_i (Σ over this rank's counted positions of depth i) / n_i, n_i the
// counted positions of the whole step on every data-parallel rank, so that the sum over
// micro-batches and ranks is coef times the mean over depths of each depth's mean.
// Only the MTP layers get a gradient (the trunk's output, the embedding and the head are
// read detached). Metric terms: train/mtp_loss (the mean over depths of each depth's
// mean loss) and train/mtp_<i+1>_loss.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "model/precision.h"

namespace slimpi {

class MetricSums;
class Transformer;
struct PackedBatch;

struct MtpLossSpec {
  double coef = 0.0;
  std::string kind = "ce";           // "ce" | "distill"
  int64_t distill_top_k = 8;
  std::vector<double> n_counted;     // per depth, over the step's every micro-batch and dp rank
  Precision precision = Precision::FP32;
};

// The counted positions of depth i of one sample: x[p + i + 1] and x[p + i + 2] both
// response tokens (response index r = local position − prompt length) with mask 1.
// mask: [R] of the sample (empty: all 1). Returns their number.
double mtp_counted_positions(int64_t prompt_length, int64_t length, const std::vector<float>& mask, int64_t depth);

// The micro-batch's MTP loss (0-dim, with autograd into the MTP layers). hidden [T, d]:
// the trunk's final-norm output on b (detached here). masks: per sample of the
// micro-batch, [R_i] fp32 on the model's device.
at::Tensor mtp_loss(const Transformer& model, const PackedBatch& b, const at::Tensor& hidden,
                    const std::vector<at::Tensor>& masks, const MtpLossSpec& spec, MetricSums& sums);

// Declares the metrics mtp_loss adds (every rank, whatever it holds).
void declare_mtp_metrics(int64_t n_depths, MetricSums& sums);

}  // namespace slimpi
