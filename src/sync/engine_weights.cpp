#include "sync/engine_weights.h"

#include "io/tensor_io.h"
#include "model/transformer.h"
#include "sync/fp8_weights.h"

namespace slimpi {
namespace {

// The fp32 masters (whole: the seeded init or the file's) through FP8 into `engine`.
void load_through_fp8(Transformer& engine, uint64_t seed, const std::string& path, const std::string& group) {
  Transformer masters(engine.config(), seed, engine.device());
  if (!path.empty()) load_model_weights(masters.parameters(), path, group, false, StoredWhole{&engine.config(), {}});
  if (!engine.sharded()) {
    copy_through_fp8(masters, engine);
    return;
  }
  Transformer whole(engine.config(), seed, engine.device(), engine.weight_dtype());
  copy_through_fp8(masters, whole);
  engine.copy_shard_from(whole);
}

}  // namespace

void load_engine_weights(Transformer& engine, bool fp8, uint64_t seed, const std::string& path,
                         const std::string& group) {
  if (fp8) return load_through_fp8(engine, seed, path, group);
  if (path.empty()) return;  // the seeded init the model was made with
  load_model_weights(engine.parameters(), path, group, /*expert_sharded=*/false,
                     StoredWhole{&engine.config(), engine.tensor_shard()});
}

}  // namespace slimpi
