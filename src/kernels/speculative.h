// Exact speculative sampling of one chain of drafted tokens (Leviathan et al. 2023, Chen
// et al. 2023), as the rollout engine verifies its MTP drafts (rollout/engine.h).
//
// The target's distributions p_0..p_D come from rows z_0..z_D of its logits (row j scores
// the token after the verified prefix and drafts d_1..d_j) under the sampling rule of
// kernels/sampling.h (temperature, top-k, top-p: zero outside the candidates); the
// draft proposed d_{j+1} ~ q_{j+1} (its own distributions under the same rule). For j =
// 0, 1, ...:
//   accept d_{j+1} when a_j < min(1, p_j(d_{j+1}) / q_{j+1}(d_{j+1}));
//   else emit a token drawn from the residual max(0, p_j − q_{j+1}) / Σ (with r_j) and stop.
// When every draft is accepted, one more token is drawn from p_D by the plain rule (with
// the bonus uniform). Each emitted token is then distributed exactly as p_j: the chain
// samples the target, whatever the draft. Greedy (T <= 0): d_{j+1} is accepted when it
// is p_j's arg-max, else the arg-max is emitted, so the tokens are greedy decoding's.
// Uniforms are the caller's (counter-based: kernels/counter_rng.h), so a chain's verdict
// is a pure function of its inputs.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/sampling.h"

namespace slimpi {

struct ChainVerdict {
  std::vector<int64_t> tokens;   // the accepted drafts, then the token the target adds (residual or bonus)
  std::vector<int32_t> support;  // per token: its row's candidate-set size (0: the whole vocabulary)
  int64_t n_accepted = 0;        // drafts kept (tokens.size() - 1)
};

// z: [D + 1, V] row-major target logits; q: [D, V] the draft's distributions (may be
// null when rule.temperature <= 0); drafts [D]; accept_u and residual_u [D] and
// bonus_u: uniforms in [0, 1).
ChainVerdict verify_chain(const float* z, const float* q, const int64_t* drafts, int64_t D, int64_t vocab,
                          const SamplingRow& rule, const double* accept_u, const double* residual_u, double bonus_u);

}  // namespace slimpi
