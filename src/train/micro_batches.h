// Splitting one rank's samples into micro-batches (gradient accumulation).
//   fixed:   n_micro_batches contiguous, near-equal groups (in sample order)
//   dynamic: first-fit by max_tokens (sample order; a sample longer than max_tokens
//            gets a micro-batch of its own), slime's dynamic batch
// Either way every sample is in exactly one micro-batch and the loss does not depend
// on the split (the Reducer normalises by step-wide counts).
#pragma once

#include <cstdint>
#include <vector>

namespace slimpi {

// lengths: tokens per sample. Returns the sample indices of each micro-batch (no
// empty micro-batch; none at all for no samples).
std::vector<std::vector<int64_t>> plan_micro_batches(const std::vector<int64_t>& lengths, int64_t n_micro_batches,
                                                     int64_t max_tokens);

}  // namespace slimpi
