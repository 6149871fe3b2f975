// Sparse mixture-of-experts MLP, one layer:
//   router logits z = h · W_routerᵀ                         [T, E]
//   softmax router (Qwen3-MoE, Mixtral):
//     p = softmax(z) in fp32;  (w, i) = top-k of p per token  [T, k]
//   sigmoid router (DeepSeekMoE: DeepSeek-V3, GLM-4.5; z an fp32 product, W and b used as
//   their bf16 roundings in a bf16 forward, as every weight is):
//     p = σ(z);  c = p + b (b: the score correction bias, or 0) chooses, p weighs:
//     with G groups of E/G experts, group g scores Σ of its top-2 c; a token keeps the
//     topk_group best groups (c = −∞ elsewhere);  i = top-k of c;  w = p gathered at i
//   w /= Σ w (+ 1e-20 for sigmoid, as transformers) when norm_topk_prob;  w *= scale
//   out_t = Σ_j w_tj · down_e(silu(gate_e(h_t)) ⊙ up_e(h_t)),  e = i_tj
// Dropless: every token runs its k experts. With a shared expert every token also runs
// it: Qwen2-MoE's behind a sigmoid gate, out_t += σ(h_t · g) · SwiGLU_shared(h_t);
// DeepSeekMoE's ungated, out_t += SwiGLU_shared(h_t). moe_mlp gives the routed part; the
// shared part is shared_experts_mlp's (the caller adds it: under tensor parallelism the
// shared experts split as a dense MLP does, Transformer::moe_residual). The correction bias b is read
// detached: its gradient is always zero (it is a parameter only so that loading,
// checkpoints, the weight sync and export carry it; AdamW leaves a parameter whose
// gradient is zero exactly as it is). The token-expert pairs are sorted by expert,
// so each expert runs one GEMM over its rows (a loop over experts, not tokens), and the
// weighted outputs are added back per token with one index_add.
// Replay (Rollout Routing Replay): given expert ids [T, k], the layer runs those experts
// instead of its own top-k, with weights from its own router: p gathered at the given
// ids (renormalised when norm_topk_prob, scaled), as slime's R3 does. A row of -1 routes that
// token by the router (a token the engine never ran: a sequence's last).
// Auxiliary losses over the router logits of every MoE layer of a forward:
//   load balancing (transformers' load_balancing_loss_func, no attention mask): with the
//     layers' tokens together, E · Σ_j Σ_e f_je · P_e, f_je = share of tokens whose j-th
//     choice (by the router's scores, no bias or groups) is e, P_e = mean router
//     probability of e (sigmoid router: σ(z) normalised over the experts, as Megatron's
//     aux loss takes sigmoid scores)
//   z-loss (ST-MoE): mean over layers' tokens of logsumexp(z)²
// Under pipeline parallelism a stage holds some of the layers. With N = L·T rows of every
// layer together, C_je the rows whose j-th choice is e (every layer's: not differentiable)
// and S_e = Σ over a stage's rows of P, the load-balancing loss is E/N² · Σ_je C_je · Σ_s S_e,
// a sum of one part per stage, E/N² · Σ_je C_je · S_e (its gradient reaches the stage's
// own routers), once the stages have added up C; the z-loss is Σ_s Σ over s's rows of
// logsumexp(z)² / N.
// Expert parallelism (parallel.expert_parallel = G): the E experts are sharded in blocks
// over the G ranks of an expert-parallel group, rank g holding [g·E/G, (g+1)·E/G); the
// router and everything else are replicated. Each rank routes its own tokens, sends each
// token-expert pair's input row to the expert's owner (one all-to-all), the owner runs its
// experts over the rows of every rank (one GEMM per expert), and the outputs travel back
// (a second all-to-all) to be weighted and summed where the token lives. Both exchanges
// are differentiable (parallel/row_exchange.h), so backward sends the gradients back the
// same way. Every rank of the group must run each forward (and backward) together.
// Stateless functions; the Transformer owns the weights.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace slimpi {

class Comm;

// Which experts a model holds: the whole set, or one block of an expert-parallel group.
struct ExpertShard {
  int rank = 0, size = 1;  // place in the expert-parallel group, its size (1: every expert here)
  Comm* comm = nullptr;    // the group (required when size > 1)
  int64_t first(int64_t n_experts) const { return n_experts / size * rank; }
  int64_t count(int64_t n_experts) const { return n_experts / size; }
};

// How a layer's router picks and weighs experts (the formulas above).
struct MoeRouting {
  int64_t k = 2;                // experts per token
  bool norm_topk_prob = true;
  bool sigmoid = false;         // DeepSeekMoE's sigmoid scores (else softmax)
  int64_t n_group = 1, topk_group = 1;
  double scale = 1.0;           // routed_scaling_factor
};

struct MoeWeights {
  at::Tensor router;                    // [E, d]: every expert's row, also when sharded
  at::Tensor score_bias;                // [E] DeepSeekMoE's e_score_correction_bias (undefined: none)
  std::vector<at::Tensor> gate, up;     // E_local x [f, d]: experts first_expert, first_expert + 1, ...
  std::vector<at::Tensor> down;         // E_local x [d, f]
  int64_t first_expert = 0;
  Comm* ep = nullptr;                   // expert-parallel group (null: every expert is local)
  // The shared expert (undefined: none): out += SwiGLU(h), times σ(h · shared_gate) when
  // the gate is defined (Qwen2-MoE; DeepSeekMoE's n_shared_experts are ungated).
  // ([fs / t, d], [fs / t, d], [d, fs / t]: this rank's slice under tensor parallelism t)
  at::Tensor shared_gate_proj, shared_up, shared_down;  // [fs, d], [fs, d], [d, fs]
  at::Tensor shared_gate;                               // [1, d] or undefined
};

struct MoeLayerOutput {
  at::Tensor out;            // [T, d], h's dtype (the fp32 residual stream's, also in a bf16 forward)
  at::Tensor chosen;         // [T, k] int64: the experts each token ran
  at::Tensor routed;         // [T, k] int64: the router's own top-k (= chosen unless replaying)
  at::Tensor router_logits;  // [T, E] fp32 (autograd through the router)
};

// The routed experts. h [T, d]; replay [T, k] int64 or undefined (route by the router's top-k).
MoeLayerOutput moe_mlp(const at::Tensor& h, const MoeWeights& w, const MoeRouting& routing,
                       const at::Tensor& replay = at::Tensor());

// The shared experts' SwiGLU, down(silu(gate(h)) ⊙ up(h)), h [T, d] -> [T, d] in h's dtype,
// without Qwen2-MoE's gate (applied to the sum); undefined when the layer has none. With
// weights split over a tensor-parallel group (gate/up rows, down columns) it is this
// rank's partial sum.
at::Tensor shared_experts_mlp(const at::Tensor& h, const MoeWeights& w);

// router_logits: one [T, E] fp32 tensor per MoE layer (the same T). Scalars with autograd.
at::Tensor moe_load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t k, bool sigmoid = false);
at::Tensor moe_router_z_loss(const std::vector<at::Tensor>& router_logits);
// Pipeline parallelism (above): these layers' C, [k, E] f64 (no autograd; zeros for no
// layer), and a stage's parts of the two losses, given every layer's C (`counts`) and the
// rows of every layer, n_rows = N.
at::Tensor moe_choice_counts(const std::vector<at::Tensor>& router_logits, int64_t k, int64_t n_experts, bool sigmoid);
at::Tensor moe_load_balancing_loss_part(const std::vector<at::Tensor>& router_logits, const at::Tensor& counts,
                                        int64_t n_rows, bool sigmoid);
at::Tensor moe_router_z_loss_part(const std::vector<at::Tensor>& router_logits, int64_t n_rows);

}  // namespace slimpi
