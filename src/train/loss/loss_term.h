// LossTerm — one term of a training micro-batch's loss, the list of them built once per
// Trainer from its config (build_loss_terms) in the order slime's actor adds them:
//   sft                  SFT: Σ −logp · w                                     (sft.cpp)
//   policy_objective     RL: the estimator's policy loss, entropy, KL loss    (policy_objective.cpp)
//   opd_topk             on-policy distillation's top-k KL to the teacher     (opd_topk.cpp)
//   router_losses        MoE: load balancing and z-loss of the routers        (router_losses.cpp)
//   mtp                  the MTP layers' own loss (their gradient alone)      (mtp.cpp)
// The trainer packs and forwards a micro-batch and scores it (MicroBatchView); each term
// then adds itself to the loss so far (add_to: the first term makes it), in list order,
// so the sum is formed as it always was. A term declares the metrics it adds (the same
// names on every rank). A term is a function of the view: a test builds one from
// tensors, without a Trainer.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include <slimpi/sample.h>

namespace slimpi {

class MetricSums;
class Transformer;
struct MoeTrace;
struct PackedBatch;
struct ScoredMicroBatch;
struct StagedRouting;
struct TrainerConfig;

// One micro-batch as the trainer's forward left it.
struct MicroBatchView {
  const std::vector<Sample>& local;        // this rank's samples of the step
  const std::vector<int64_t>& which;       // the micro-batch's, indices into local
  const PackedBatch& batch;                // packed tokens
  const ScoredMicroBatch& scored;          // [N] log-probs, entropy, mask, reducer weights (RL: old, advantages, ...)
  const at::Tensor& hidden;                // [T, d] the trunk's output (defined when a term needs it)
  const MoeTrace* trace = nullptr;         // MoE: the routers' picks and logits
  const StagedRouting* staged_routing = nullptr;  // a pipeline's last stage: the trace its layers', counts every stage's
  std::vector<at::Tensor> masks;           // [R_i] per sample of the micro-batch
  double step_tokens = 0;                  // tokens of the step over every dp rank
  std::vector<double> step_mtp_positions;  // per MTP depth: counted positions of the step over every dp rank
};

class LossTerm {
 public:
  virtual ~LossTerm() = default;
  virtual const char* name() const = 0;
  // Declares every metric the term adds.
  virtual void declare_metrics(MetricSums& sums) const = 0;
  // loss + this term (0-dim, with autograd); `loss` undefined: the term is the first.
  virtual at::Tensor add_to(at::Tensor loss, const MicroBatchView& mb, MetricSums& sums) const = 0;
};

using LossTerms = std::vector<std::unique_ptr<LossTerm>>;

// The terms `cfg` asks for, over `policy` (its MTP layers, LM head, MoE layers).
LossTerms build_loss_terms(const TrainerConfig& cfg, const Transformer& policy);

// The terms, one constructor each (build_loss_terms chooses).
std::unique_ptr<LossTerm> make_sft_term();
std::unique_ptr<LossTerm> make_policy_objective_term(const TrainerConfig& cfg);
std::unique_ptr<LossTerm> make_opd_topk_term(const TrainerConfig& cfg, const Transformer& policy);
std::unique_ptr<LossTerm> make_router_losses_term(const TrainerConfig& cfg, const Transformer& policy);
std::unique_ptr<LossTerm> make_mtp_term(const TrainerConfig& cfg, const Transformer& policy);

}  // namespace slimpi
