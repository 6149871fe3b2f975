#include "model/moe.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <slimpi/error.h>

#include "kernels/batch_invariant.h"
#include "kernels/small_batch_linear.h"
#include "model/exact_ops.h"
#include "parallel/comm.h"
#include "parallel/comm_tensor.h"
#include "parallel/row_exchange.h"

#include <limits>
#include <utility>

namespace slimpi {

namespace {

// x [P, d]: rows grouped by local expert, n_rows[e] rows for local expert e (in order)
// -> each row through its expert's SwiGLU [P, d]. run_empty: experts without rows run
// too, on zero rows. Expert parallelism needs it: every rank's graph then has the same
// shape (each expert's gradient hook fires in the same place of every replica's
// backward, so overlapped reductions start in one order), a rank that received no rows
// still links its exchanges into the graph, and its result has the dtype the others'
// GEMMs give (bf16 under autocast).
at::Tensor run_experts(const at::Tensor& x, const int64_t* n_rows, const MoeWeights& w, bool run_empty) {
  std::vector<at::Tensor> ys;
  int64_t start = 0;
  for (size_t e = 0; e < w.gate.size(); ++e) {
    if (n_rows[e] == 0 && !run_empty) continue;
    const at::Tensor xe = x.narrow(0, start, n_rows[e]);
    ys.push_back(dense(swiglu(dense(xe, w.gate[e]), dense(xe, w.up[e])), w.down[e]));
    start += n_rows[e];
  }
  return ys.empty() ? x.narrow(0, 0, 0) : at::cat(ys);  // [P, d]; empty only for P = 0 (no token)
}

// Expert parallelism. x [P, d] sorted by global expert, counts [E] (host) rows per
// expert: the rows for rank g's experts are one contiguous block. Returns [P, d], each
// row through its expert on the expert's owner.
at::Tensor run_sharded_experts(const at::Tensor& x, const at::Tensor& counts, const MoeWeights& w) {
  Comm& ep = *w.ep;
  const int G = ep.size();
  const int64_t n_local = static_cast<int64_t>(w.gate.size());
  // What each rank sends each owner, per expert of that owner: [G, n_local] -> received
  // [G, n_local], row s = the rows source s sends for each of this rank's experts.
  const at::Tensor recv_counts = alltoallv_rows(ep, counts.view({G, n_local}).contiguous(),
                                                std::vector<int64_t>(G, 1), std::vector<int64_t>(G, 1));
  const int64_t* rc = recv_counts.data_ptr<int64_t>();
  const at::Tensor send_per_rank = counts.view({G, n_local}).sum(1);  // [G]
  std::vector<int64_t> send_rows(send_per_rank.data_ptr<int64_t>(), send_per_rank.data_ptr<int64_t>() + G);
  std::vector<int64_t> recv_rows(G, 0);
  for (int s = 0; s < G; ++s)
    for (int64_t e = 0; e < n_local; ++e) recv_rows[s] += rc[s * n_local + e];
  const at::Tensor received = exchange_rows(ep, x, send_rows, recv_rows);  // [R, d]: by source, then expert
  // Regroup by expert (source-major within an expert): one GEMM per local expert.
  std::vector<int64_t> by_expert, n_rows(n_local, 0);
  std::vector<int64_t> start_of(G * n_local);  // row of (source s, expert e) in `received`
  int64_t row = 0;
  for (int s = 0; s < G; ++s)
    for (int64_t e = 0; e < n_local; ++e) {
      start_of[s * n_local + e] = row;
      row += rc[s * n_local + e];
    }
  for (int64_t e = 0; e < n_local; ++e)
    for (int s = 0; s < G; ++s) {
      for (int64_t j = 0; j < rc[s * n_local + e]; ++j) by_expert.push_back(start_of[s * n_local + e] + j);
      n_rows[e] += rc[s * n_local + e];
    }
  const at::Tensor perm = at::tensor(by_expert, at::kLong).to(x.device());  // [R]
  const at::Tensor y_grouped = run_experts(received.index_select(0, perm), n_rows.data(), w, /*run_empty=*/true);
  // Back to the received order (perm is a permutation: index_copy inverts it), then home.
  const at::Tensor y = at::zeros_like(y_grouped).index_copy(0, perm, y_grouped);
  return exchange_rows(ep, y, recv_rows, send_rows);  // [P, d]
}

// The router's scores [T, E] fp32 and its own choice [T, k] (the formulas in moe.h).
// The sigmoid router's logits are fp32 products (transformers keeps DeepSeekMoE's gate in
// fp32; a bf16 product would move choices).
std::pair<at::Tensor, at::Tensor> route(const at::Tensor& h, const MoeWeights& w, const MoeRouting& r,
                                        at::Tensor& router_logits) {
  if (!r.sigmoid) {
    router_logits = dense(h, w.router).to(at::kFloat);  // [T, E]
    const at::Tensor probs = softmax_last(router_logits);
    return {probs, std::get<1>(at::topk(probs, r.k, -1))};
  }
  // In a bf16 forward the router and the bias are used as their bf16 roundings, as every
  // weight is (model/transformer.h): fp32 masters and a bf16 engine's weights route alike.
  const c10::DeviceType device = h.device().type();
  const bool bf16 =
      at::autocast::is_autocast_enabled(device) && at::autocast::get_autocast_dtype(device) == at::kBFloat16;
  auto as_used = [&](const at::Tensor& t) { return (bf16 ? t.to(at::kBFloat16) : t).to(at::kFloat); };
  {
    const c10::impl::ExcludeDispatchKeyGuard fp32(c10::autocast_dispatch_keyset);
    router_logits = exact_numerics() ? dense(h.to(at::kFloat), as_used(w.router))        // [T, E]
                                     : at::linear(h.to(at::kFloat), as_used(w.router));
  }
  const at::Tensor scores = sigmoid_of(router_logits);  // [T, E]
  at::Tensor choice = (w.score_bias.defined() ? scores + as_used(w.score_bias.detach()) : scores).detach();
  const int64_t T = h.size(0), E = w.router.size(0), G = r.n_group;
  if (G > 1) {
    const at::Tensor by_group = choice.view({T, G, E / G});                                    // [T, G, E/G]
    const at::Tensor group_score = std::get<0>(at::topk(by_group, 2, -1)).sum(-1);             // [T, G]
    const at::Tensor kept = std::get<1>(at::topk(group_score, r.topk_group, -1));              // [T, topk_group]
    const at::Tensor group_mask = at::zeros({T, G}, at::kBool).to(h.device()).scatter(1, kept, true);
    choice = choice.masked_fill(group_mask.logical_not().unsqueeze(-1).expand({T, G, E / G}).reshape({T, E}),
                                -std::numeric_limits<float>::infinity());
  }
  return {scores, std::get<1>(at::topk(choice, r.k, -1))};
}

}  // namespace

MoeLayerOutput moe_mlp(const at::Tensor& h, const MoeWeights& w, const MoeRouting& r, const at::Tensor& replay) {
  const int64_t T = h.size(0), E = w.router.size(0), k = r.k;
  MoeLayerOutput o;
  const auto [scores, own] = route(h, w, r, o.router_logits);  // [T, E] fp32, [T, k]
  o.routed = own;
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
  }
  at::Tensor weights = scores.gather(1, o.chosen);  // [T, k]
  if (r.norm_topk_prob) weights = normalize_last(weights, r.sigmoid ? 1e-20 : 0.0);
  if (r.scale != 1.0) weights = weights * r.scale;
  weights = weights.to(h.scalar_type());

  // Token-expert pairs sorted by expert: each expert's rows are one contiguous run.
  const at::Tensor expert_of_pair = o.chosen.reshape({-1});                        // [T·k]
  const at::Tensor order = at::argsort(expert_of_pair, /*stable=*/true, 0, false);  // [T·k]
  const at::Tensor token_of_pair = at::floor_divide(order, k);                     // [T·k] sorted
  const at::Tensor counts = at::bincount(expert_of_pair, {}, E).cpu();             // [E]
  const at::Tensor x = h.index_select(0, token_of_pair);                           // [T·k, d]
  const at::Tensor expert_out = w.ep ? run_sharded_experts(x, counts, w) : run_experts(x, counts.data_ptr<int64_t>(), w, false);
  const at::Tensor y = expert_out * weights.reshape({-1}).index_select(0, order).unsqueeze(1);  // [T·k, d]
  o.out = at::zeros_like(h).index_add(0, token_of_pair, y);
  return o;
}

at::Tensor shared_experts_mlp(const at::Tensor& h, const MoeWeights& w) {
  if (!w.shared_up.defined()) return {};
  return dense(swiglu(dense(h, w.shared_gate_proj), dense(h, w.shared_up)), w.shared_down);
}

namespace {

// P: the routers' probabilities of every row, [rows, E] (sigmoid scores normalised over
// the experts, as Megatron's aux loss takes them).
at::Tensor balance_probs(const at::Tensor& z, bool sigmoid) {
  if (!sigmoid) return at::softmax(z, -1);
  const at::Tensor p = at::sigmoid(z);
  return p / (p.sum(-1, true) + 1e-20);
}

}  // namespace

at::Tensor moe_load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t k, bool sigmoid) {
  const at::Tensor z = at::cat(router_logits);  // [L·T, E]
  const int64_t E = z.size(1);
  const at::Tensor p = balance_probs(z, sigmoid);
  const at::Tensor chosen = std::get<1>(at::topk(p, k, -1));                    // [L·T, k]
  const at::Tensor share = at::one_hot(chosen, E).to(at::kFloat).mean(0);     // [k, E]
  return (share * p.mean(0).unsqueeze(0)).sum() * double(E);
}

at::Tensor moe_router_z_loss(const std::vector<at::Tensor>& router_logits) {
  return at::logsumexp(at::cat(router_logits), -1).square().mean();
}

at::Tensor moe_choice_counts(const std::vector<at::Tensor>& router_logits, int64_t k, int64_t n_experts,
                             bool sigmoid) {
  if (router_logits.empty()) return at::zeros({k, n_experts}, at::kDouble);
  at::NoGradGuard no_grad;
  const at::Tensor p = balance_probs(at::cat(router_logits), sigmoid);               // [L_s·T, E]
  const at::Tensor chosen = std::get<1>(at::topk(p, k, -1));                        // [L_s·T, k]
  return at::one_hot(chosen, n_experts).to(at::kDouble).sum(0).cpu();               // [k, E]
}

at::Tensor moe_load_balancing_loss_part(const std::vector<at::Tensor>& router_logits, const at::Tensor& counts,
                                        int64_t n_rows, bool sigmoid) {
  const at::Tensor p = balance_probs(at::cat(router_logits), sigmoid);  // [L_s·T, E]
  const double N = double(n_rows);
  const at::Tensor share = (counts / N).to(p.device(), at::kFloat);     // [k, E]
  return (share * (p.sum(0) / N).unsqueeze(0)).sum() * double(p.size(1));
}

at::Tensor moe_router_z_loss_part(const std::vector<at::Tensor>& router_logits, int64_t n_rows) {
  return at::logsumexp(at::cat(router_logits), -1).square().sum() / double(n_rows);
}

}  // namespace slimpi
