// Engine weights from a file: what an engine's model holds before its first weight sync
// and after a resume. Whole tensors are read (a model.init_from, a checkpoint's
// trainer_state.h5) and a tensor-parallel engine's rank keeps its part; for
// rollout.precision = "fp8" the fp32 weights go through FP8 blocks first, as every sync
// quantises them (sync/fp8_weights.h). The one loader of the run's engines (fresh start
// and resume) and of `slimpi generate`.
#pragma once

#include <cstdint>
#include <string>

namespace slimpi {

class Transformer;

// `engine`'s weights <- group `group` of `path` (an HDF5 file or a Hugging Face
// checkpoint). An empty path is the seeded init of run seed `seed`: nothing to do
// unless `fp8` (then that init through FP8, as a sync from a fresh trainer sends it).
void load_engine_weights(Transformer& engine, bool fp8, uint64_t seed, const std::string& path,
                         const std::string& group = "model");

}  // namespace slimpi
