#include "model/tensor_shard.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include "model/model_config.h"

namespace slimpi {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

int64_t padded_vocab_size(int64_t vocab_size, int t) {
  if (t <= 1) return vocab_size;
  const int64_t multiple = 128 * int64_t(t);
  return (vocab_size + multiple - 1) / multiple * multiple;
}

ParameterSplit parameter_split(const std::string& full_name, const ModelConfig& cfg, int t) {
  if (t <= 1) return {};
  const size_t slash = full_name.rfind('/');
  const std::string name = slash == std::string::npos ? full_name : full_name.substr(slash + 1);
  const int64_t hd = cfg.head_dim(), q = cfg.n_heads * hd, kv = cfg.n_kv_heads * hd, f = cfg.intermediate_size;
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight")
    return {0, cfg.vocab_size, padded_vocab_size(cfg.vocab_size, t)};
  if (ends_with(name, ".self_attn.q_proj.weight") || ends_with(name, ".self_attn.q_proj.bias")) return {0, q, q};
  if (ends_with(name, ".self_attn.k_proj.weight") || ends_with(name, ".self_attn.k_proj.bias") ||
      ends_with(name, ".self_attn.v_proj.weight") || ends_with(name, ".self_attn.v_proj.bias"))
    return {0, kv, kv};
  if (ends_with(name, ".self_attn.o_proj.weight")) return {1, q, q};
  // The dense MLP only: ".mlp.experts.<e>." and ".mlp.shared_expert." tensors are MoE's.
  if (ends_with(name, ".mlp.gate_proj.weight") || ends_with(name, ".mlp.up_proj.weight")) return {0, f, f};
  if (ends_with(name, ".mlp.down_proj.weight")) return {1, f, f};
  return {};
}

at::Tensor shard_of_whole(const at::Tensor& whole, const ParameterSplit& split, const TensorShard& shard) {
  if (!split.split() || shard.size <= 1) return whole;
  SLIMPI_CHECK(whole.size(split.dim) == split.whole, "tensor-parallel split of a tensor of {} along dim {}, expected {}",
               whole.size(split.dim), split.dim, split.whole);
  at::Tensor padded = whole;
  if (split.padded > split.whole) {
    std::vector<int64_t> shape = whole.sizes().vec();
    shape[size_t(split.dim)] = split.padded - split.whole;
    padded = at::cat({whole, at::zeros(shape, whole.options())}, split.dim);
  }
  const int64_t n = split.padded / shard.size;
  return padded.narrow(split.dim, n * shard.rank, n).clone();
}

at::Tensor whole_of_shards(const at::Tensor& stacked, const ParameterSplit& split) {
  const at::Tensor whole = at::cat(stacked.unbind(0), split.dim);
  return split.padded > split.whole ? whole.narrow(split.dim, 0, split.whole).contiguous() : whole;
}

std::vector<int64_t> StoredWhole::whole_shape(const std::string& name, const std::vector<int64_t>& local) const {
  if (!active()) return local;
  const ParameterSplit split = parameter_split(name, *cfg, shard.size);
  std::vector<int64_t> whole = local;
  if (split.split() && size_t(split.dim) < whole.size()) whole[size_t(split.dim)] = split.whole;
  return whole;
}

at::Tensor StoredWhole::part_of(const std::string& name, const at::Tensor& whole) const {
  if (!active()) return whole;
  return shard_of_whole(whole, parameter_split(name, *cfg, shard.size), shard);
}

void check_tensor_parallel_shape(const ModelConfig& cfg, int t) {
  if (t <= 1) return;
  SLIMPI_CHECK(cfg.n_heads % t == 0, "tensor parallelism over {} ranks splits attention by heads: the model has {} "
               "query heads, not divisible by {}", t, cfg.n_heads, t);
  SLIMPI_CHECK(cfg.n_kv_heads % t == 0, "tensor parallelism over {} ranks splits attention by heads: the model has "
               "{} key/value heads, not divisible by {} (replicating key/value heads over a larger group is not "
               "implemented yet; use parallel.tensor_parallel <= {})", t, cfg.n_kv_heads, t, cfg.n_kv_heads);
  SLIMPI_CHECK(cfg.intermediate_size % t == 0, "tensor parallelism over {} ranks splits the MLP: intermediate_size "
               "{} is not divisible by {}", t, cfg.intermediate_size, t);
}

}  // namespace slimpi
