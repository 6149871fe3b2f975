#include "model/kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "model/tensor_shard.h"

namespace slimpi {

KvCache KvCache::allocate(const ModelConfig& cfg, int64_t n_slots, const at::TensorOptions& options,
                          int tensor_parallel, int64_t mtp_layers) {
  KvCache c;
  const int64_t heads = local_kv_heads(cfg, tensor_parallel);
  for (int64_t l = 0; l < cfg.n_layers + std::min(mtp_layers, cfg.mtp_num_layers); ++l) {
    c.k.push_back(at::zeros({n_slots, heads, cfg.head_dim()}, options));
    c.v.push_back(at::zeros({n_slots, heads, cfg.head_dim()}, options));
  }
  if (cfg.n_experts > 0)
    c.routing = at::full({n_slots, cfg.n_moe_layers(), cfg.n_experts_per_tok}, -1, options.dtype(at::kShort));
  return c;
}

}  // namespace slimpi
