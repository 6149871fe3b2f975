#include "train/moe_terms.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "model/moe.h"
#include "model/transformer.h"
#include "train/metric_sums.h"
#include "train/trainer_config.h"

namespace slimpi {
namespace {

std::string matches_name(int64_t layer) { return fmt::format("train/routing_matches/layer_{}", layer); }
std::string positions_name(int64_t layer) { return fmt::format("train/routing_positions/layer_{}", layer); }

}  // namespace

std::vector<int64_t> moe_layer_indices(const ModelConfig& mc) {
  std::vector<int64_t> out;
  for (int64_t l = 0; l < mc.n_layers; ++l)
    if (mc.is_moe_layer(l)) out.push_back(l);
  return out;
}

void declare_moe_metrics(const std::vector<int64_t>& moe_layers, MetricSums& sums) {
  for (const char* k : {"train/moe_aux_loss", "train/moe_z_loss"}) sums.add_value(k, 0.0);
  for (int64_t l : moe_layers) {
    sums.add_value(matches_name(l), 0.0);
    sums.add_value(positions_name(l), 0.0);
  }
}

void add_routing_agreement(const MoeTrace& trace, const at::Tensor& rollout_routing,
                           const std::vector<int64_t>& moe_layers, MetricSums& sums) {
  const at::Tensor valid = rollout_routing.select(2, 0) >= 0;  // [T, L]
  const at::Tensor same =
      std::get<0>(trace.routed.sort(-1)).eq(std::get<0>(rollout_routing.sort(-1))).all(-1) & valid;  // [T, L]
  const at::Tensor per_layer_same = same.sum(0).to(at::kDouble), per_layer_valid = valid.sum(0).to(at::kDouble);
  for (size_t j = 0; j < moe_layers.size(); ++j) {
    sums.add_tensor(matches_name(moe_layers[j]), per_layer_same[j]);
    sums.add_tensor(positions_name(moe_layers[j]), per_layer_valid[j]);
  }
}

at::Tensor add_router_losses(at::Tensor loss, const MoeTrace& trace, int64_t k, bool sigmoid, double share,
                             const TrainerConfig& cfg, MetricSums& sums, const StagedRouting* staged) {
  if (staged && trace.router_logits.empty()) return loss;  // a stage of dense layers
  const int64_t n_rows = staged ? staged->n_layers * trace.router_logits.front().size(0) : 0;
  const at::Tensor aux = staged ? moe_load_balancing_loss_part(trace.router_logits, staged->counts, n_rows, sigmoid)
                                : moe_load_balancing_loss(trace.router_logits, k, sigmoid);
  const at::Tensor z = staged ? moe_router_z_loss_part(trace.router_logits, n_rows)
                              : moe_router_z_loss(trace.router_logits);
  auto plus = [&](const at::Tensor& term) { loss = loss.defined() ? loss + term : term; };
  if (cfg.moe_aux_loss_coef > 0) plus(share * cfg.moe_aux_loss_coef * aux);
  if (cfg.moe_z_loss_coef > 0) plus(share * cfg.moe_z_loss_coef * z);
  sums.add_tensor("train/moe_aux_loss", aux * share);
  sums.add_tensor("train/moe_z_loss", z * share);
  return loss;
}

void finish_routing_metrics(const std::vector<int64_t>& moe_layers, std::map<std::string, double>& metrics) {
  double all_matches = 0, all_positions = 0;
  for (int64_t l : moe_layers) {
    const std::string matches = matches_name(l), positions = positions_name(l);
    all_matches += metrics[matches];
    all_positions += metrics[positions];
    if (metrics[positions] > 0)
      metrics[fmt::format("train/routing_agreement_by_layer/{}", l)] = metrics[matches] / metrics[positions];
    metrics.erase(matches);
    metrics.erase(positions);
  }
  if (all_positions > 0) metrics["train/routing_agreement"] = all_matches / all_positions;
}

}  // namespace slimpi
