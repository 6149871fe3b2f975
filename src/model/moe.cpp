#include "model/moe.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

namespace slimpi {

MoeLayerOutput moe_mlp(const at::Tensor& h, const MoeWeights& w, int64_t k, bool norm_topk_prob,
                       const at::Tensor& replay) {
  const int64_t T = h.size(0), E = w.router.size(0);
  MoeLayerOutput o;
  o.router_logits = at::linear(h, w.router).to(at::kFloat);  // [T, E]
  const at::Tensor probs = at::softmax(o.router_logits, -1);  // [T, E] fp32
  at::Tensor weights;                                         // [T, k]
  std::tie(weights, o.routed) = at::topk(probs, k, -1);
  o.chosen = o.routed;
  if (replay.defined()) {
    SLIMPI_CHECK(replay.dim() == 2 && replay.size(0) == T && replay.size(1) == k,
                 "routing replay: expert ids of shape [{}, {}] for {} tokens and top-{}",
                 replay.dim() > 0 ? replay.size(0) : 0, replay.dim() > 1 ? replay.size(1) : 0, T, k);
    const at::Tensor given = replay.to(at::kLong);
    o.chosen = at::where(given >= 0, given, o.routed);  // -1 rows: the router's own choice
    // Checked before any kernel indexes with them (on a GPU a bad id is a device assert).
    SLIMPI_CHECK(T == 0 || (given.min().item<int64_t>() >= -1 && o.chosen.max().item<int64_t>() < E),
                 "routing replay: expert ids outside [0, {}) (or -1: route)", E);
    weights = probs.gather(1, o.chosen);
  }
  if (norm_topk_prob) weights = weights / weights.sum(-1, /*keepdim=*/true);
  weights = weights.to(h.scalar_type());

  // Token-expert pairs sorted by expert: each expert's rows are one contiguous run.
  const at::Tensor expert_of_pair = o.chosen.reshape({-1});                        // [T·k]
  const at::Tensor order = at::argsort(expert_of_pair, /*stable=*/true, 0, false);  // [T·k]
  const at::Tensor token_of_pair = at::floor_divide(order, k);                     // [T·k] sorted
  const at::Tensor counts = at::bincount(expert_of_pair, {}, E).cpu();             // [E]
  const at::Tensor x = h.index_select(0, token_of_pair);                           // [T·k, d]
  std::vector<at::Tensor> ys;
  int64_t start = 0;
  const int64_t* n_rows = counts.data_ptr<int64_t>();
  for (int64_t e = 0; e < E; ++e) {
    if (n_rows[e] == 0) continue;
    const at::Tensor xe = x.narrow(0, start, n_rows[e]);
    ys.push_back(at::linear(at::silu(at::linear(xe, w.gate[e])) * at::linear(xe, w.up[e]), w.down[e]));
    start += n_rows[e];
  }
  const at::Tensor y = at::cat(ys) * weights.reshape({-1}).index_select(0, order).unsqueeze(1);  // [T·k, d]
  o.out = at::zeros_like(h).index_add(0, token_of_pair, y);
  if (w.shared_gate.defined())
    o.out = o.out + at::sigmoid(at::linear(h, w.shared_gate)) *
                        at::linear(at::silu(at::linear(h, w.shared_gate_proj)) * at::linear(h, w.shared_up), w.shared_down);
  return o;
}

at::Tensor moe_load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t k) {
  const at::Tensor z = at::cat(router_logits);  // [L·T, E]
  const int64_t E = z.size(1);
  const at::Tensor p = at::softmax(z, -1);
  const at::Tensor chosen = std::get<1>(at::topk(p, k, -1));                    // [L·T, k]
  const at::Tensor share = at::one_hot(chosen, E).to(at::kFloat).mean(0);     // [k, E]
  return (share * p.mean(0).unsqueeze(0)).sum() * double(E);
}

at::Tensor moe_router_z_loss(const std::vector<at::Tensor>& router_logits) {
  return at::logsumexp(at::cat(router_logits), -1).square().mean();
}

}  // namespace slimpi
