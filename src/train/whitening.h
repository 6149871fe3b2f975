// Distributed advantage whitening (slime's --normalize-advantages), over every token
// of the step on every data-parallel rank:
//   μ = ΣA·m / Σm,  var = (ΣA²·m / Σm − μ²) · N/(N−1)  (N = Σm),  A' = (A − μ)·rsqrt(var + 1e-8)
// The three sums are all-reduced over `comm` (null = this rank alone), so every rank
// computes the same μ and var, including a rank that holds no tokens.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "parallel/comm.h"

namespace slimpi {

// advantages[i], masks[i]: [R_i] of this rank's sample i. Rewrites advantages in place.
void whiten_advantages(std::vector<at::Tensor>& advantages, const std::vector<at::Tensor>& masks, Comm* comm);

}  // namespace slimpi
