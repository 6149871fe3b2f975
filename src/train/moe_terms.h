// The mixture-of-experts terms of a training step (model.n_experts > 0):
//  * routing agreement — per MoE layer, the token positions where the trainer's router
//    picks the same set of experts the engine ran (counted before any replay), summed
//    over the step and turned into shares at its end (train/routing_agreement,
//    train/routing_agreement_by_layer/<layer>);
//  * the routers' auxiliary losses — load balancing and z-loss of each micro-batch,
//    weighted by its share of the step's tokens (over all ranks), so that the step's
//    loss adds their token-weighted means times train.moe_aux_loss_coef / moe_z_loss_coef.
//    Under pipeline parallelism each stage adds its parts (model/moe.h), given every
//    stage's choice counts (StagedRouting), and the step's metrics add up the stages'.
// Stateless functions over one forward's MoeTrace.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace slimpi {

class MetricSums;
struct ModelConfig;
struct MoeTrace;
struct TrainerConfig;

// The model layer of each MoE layer.
std::vector<int64_t> moe_layer_indices(const ModelConfig& mc);
// Declares every MoE metric of a step (the same names on every rank).
void declare_moe_metrics(const std::vector<int64_t>& moe_layers, MetricSums& sums);
// rollout_routing: [T, L, k] the engine's experts, -1 where none; trace.routed the same
// shape, the trainer routers' own picks.
void add_routing_agreement(const MoeTrace& trace, const at::Tensor& rollout_routing,
                           const std::vector<int64_t>& moe_layers, MetricSums& sums);
// Pipeline parallelism: what a stage's parts of the router losses take from the others.
struct StagedRouting {
  at::Tensor counts;     // [k, E] f64: the micro-batch's choice counts over every MoE layer of the model
  int64_t n_layers = 0;  // the model's MoE layers
};
// loss + share · (aux_coef · aux + z_coef · z), each term added only when its
// coefficient is > 0 (loss undefined: the terms alone, undefined if none); the terms go
// into `sums` weighted by `share` either way. sigmoid: the routers score by sigmoid
// (DeepSeekMoE; model/moe.h's aux loss for it). staged: the trace is a pipeline stage's
// (its layers only, maybe none): its parts of aux and z.
at::Tensor add_router_losses(at::Tensor loss, const MoeTrace& trace, int64_t k, bool sigmoid, double share,
                             const TrainerConfig& cfg, MetricSums& sums, const StagedRouting* staged = nullptr);
// The reduced per-layer counts -> shares (layers that saw no trace get no entry).
void finish_routing_metrics(const std::vector<int64_t>& moe_layers, std::map<std::string, double>& metrics);

}  // namespace slimpi
