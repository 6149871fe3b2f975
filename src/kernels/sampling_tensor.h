// The device executor of the sampling rule in kernels/sampling.h: the same tokens and
// supports as sample_tokens, computed with torch ops on the logits' device, so the
// engine on a GPU never copies logits to the host (only R tokens and supports come
// back). The uniforms come from the counter RNG (kernels/counter_rng.h) evaluated on
// the device on int64 tensors: the same definition the host executor runs on uint64_t.
//
// Equal logits give equal tokens on both executors: the arithmetic is the host's, step
// for step (double exp of (z - zmax) / T, prefix sums in index order, the same
// comparisons). On CPU they agree exactly (tested); on a GPU the parallel prefix sum
// may round differently, which can move a token only when u·total falls within a few
// ulps of a boundary.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "kernels/sampling.h"

namespace slimpi {

// The counter-RNG coordinates of one draw: u = counter_uniform(seed, sample, position).
struct DrawCoordinates {
  uint64_t seed = 0;
  uint64_t sample = 0;
  uint64_t position = 0;
};

struct SampledTokens {
  at::Tensor tokens;   // [R] int64, on the logits' device
  at::Tensor support;  // [R] int64: the candidate-set size, 0 for the whole vocabulary
};

// logits: [R, V] float on any device. rows[b]: temperature, top_k, top_p of row b (its
// `uniform` is not used); draws[b]: where row b's uniform comes from.
SampledTokens sample_tokens_tensor(const at::Tensor& logits, const std::vector<SamplingRow>& rows,
                                   const std::vector<DrawCoordinates>& draws);

// u [N] float64 on `device`, the uniforms of `draws` computed there (for tests).
at::Tensor counter_uniforms_tensor(const std::vector<DrawCoordinates>& draws, const at::Device& device);

}  // namespace slimpi
