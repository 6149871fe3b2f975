#include "model/tensor_shard.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include <algorithm>
#include <utility>

#include "model/model_config.h"

namespace slimpi {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

LinearHeads local_linear_heads(const ModelConfig& cfg, int t) {
  return {cfg.linear_num_key_heads / t, cfg.linear_num_value_heads / t, cfg.linear_conv_dim() / t};
}

int64_t padded_vocab_size(int64_t vocab_size, int t) {
  if (t <= 1) return vocab_size;
  const int64_t multiple = 128 * int64_t(t);
  return (vocab_size + multiple - 1) / multiple * multiple;
}

int kv_head_replicas(const ModelConfig& cfg, int t) {
  return t > cfg.n_kv_heads && cfg.n_kv_heads > 0 && t % cfg.n_kv_heads == 0 ? int(t / cfg.n_kv_heads) : 1;
}

int64_t local_kv_heads(const ModelConfig& cfg, int t) { return cfg.n_kv_heads * kv_head_replicas(cfg, t) / t; }

KvCacheRow kv_cache_row(const ModelConfig& cfg, int t, bool latent) {
  if (cfg.is_mla() && latent) return {1, cfg.kv_lora_rank + cfg.qk_rope_head_dim, 1};
  return {local_kv_heads(cfg, t), cfg.head_dim(), 2};
}

ParameterSplit parameter_split(const std::string& full_name, const ModelConfig& cfg, int t) {
  if (t <= 1) return {};
  const size_t slash = full_name.rfind('/');
  const std::string name = slash == std::string::npos ? full_name : full_name.substr(slash + 1);
  const int64_t hd = cfg.head_dim(), q = cfg.n_heads * hd, kv = cfg.n_kv_heads * hd, f = cfg.intermediate_size;
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight")
    return {0, cfg.vocab_size, padded_vocab_size(cfg.vocab_size, t)};
  if (ends_with(name, ".self_attn.q_proj.weight") || ends_with(name, ".self_attn.q_proj.bias")) {
    const int64_t rows = cfg.attn_output_gate ? 2 * q : q;  // (gated: each head's query and gate rows, contiguous)
    return {0, rows, rows};
  }
  if (ends_with(name, ".self_attn.k_proj.weight") || ends_with(name, ".self_attn.k_proj.bias") ||
      ends_with(name, ".self_attn.v_proj.weight") || ends_with(name, ".self_attn.v_proj.bias"))
    return {0, kv, kv, kv_head_replicas(cfg, t)};
  if (cfg.is_mla()) {  // by heads: q_b_proj's and kv_b_proj's rows, o_proj's columns; the latents whole
    const int64_t kv_b = cfg.n_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), o = cfg.n_heads * cfg.v_head_dim;
    if (ends_with(name, ".self_attn.q_b_proj.weight")) return {0, q, q};
    if (ends_with(name, ".self_attn.kv_b_proj.weight")) return {0, kv_b, kv_b};
    if (ends_with(name, ".self_attn.o_proj.weight")) return {1, o, o};
  }
  if (ends_with(name, ".self_attn.o_proj.weight")) return {1, q, q};
  // A Gated DeltaNet layer by key heads (and the value heads that read them): its q/k/v
  // channels grouped by key head (model/linear_channels.h), Qwen3-Next's fused rows, z, b,
  // a, dt_bias and A_log by value head, out_proj's columns; the gated norm whole.
  if (cfg.is_hybrid() && name.find(".linear_attn.") != std::string::npos) {
    const int64_t c = cfg.linear_conv_dim(), vd = cfg.linear_value_dim(), hv = cfg.linear_num_value_heads;
    if (ends_with(name, ".in_proj_qkv.weight") || ends_with(name, ".conv1d.weight")) return {0, c, c};
    if (ends_with(name, ".in_proj_qkvz.weight")) return {0, c + vd, c + vd};
    if (ends_with(name, ".in_proj_ba.weight")) return {0, 2 * hv, 2 * hv};
    if (ends_with(name, ".in_proj_z.weight")) return {0, vd, vd};
    if (ends_with(name, ".in_proj_b.weight") || ends_with(name, ".in_proj_a.weight") ||
        ends_with(name, ".dt_bias") || ends_with(name, ".A_log"))
      return {0, hv, hv};
    if (ends_with(name, ".out_proj.weight")) return {1, vd, vd};
    return {};
  }
  // The dense MLP (".mlp.experts.<e>." tensors are the routed experts', whole on every rank).
  if (ends_with(name, ".mlp.gate_proj.weight") || ends_with(name, ".mlp.up_proj.weight")) return {0, f, f};
  if (ends_with(name, ".mlp.down_proj.weight")) return {1, f, f};
  // The shared experts split as the dense MLP does: DeepSeekMoE's n_shared_experts of
  // moe_intermediate_size (one MLP of their total width), Qwen2-MoE's shared expert (its
  // gate, shared_expert_gate, is whole).
  for (const auto& [part, fs] : {std::pair<const char*, int64_t>{".mlp.shared_experts.", cfg.shared_experts_width()},
                                 {".mlp.shared_expert.", cfg.shared_expert_intermediate_size}}) {
    const std::string prefix(part);
    if (ends_with(name, prefix + "gate_proj.weight") || ends_with(name, prefix + "up_proj.weight")) return {0, fs, fs};
    if (ends_with(name, prefix + "down_proj.weight")) return {1, fs, fs};
  }
  return {};
}

bool first_holder(const std::string& name, const ModelConfig& cfg, const TensorShard& shard) {
  const ParameterSplit split = parameter_split(name, cfg, shard.size);
  return split.split() ? split.first_replica(shard.rank) : shard.rank == 0;
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
  const int64_t n = split.part_extent(shard.size);
  return padded.narrow(split.dim, n * split.part_of_rank(shard.rank), n).clone();
}

at::Tensor whole_of_shards(const at::Tensor& stacked, const ParameterSplit& split) {
  std::vector<at::Tensor> parts;  // the first replica of each part
  for (int64_t r = 0; r < stacked.size(0); r += split.replicas) parts.push_back(stacked[r]);
  const at::Tensor whole = at::cat(parts, split.dim);
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

StoredWhole::Span StoredWhole::span_of(const std::string& name, const std::vector<int64_t>& local, int64_t begin,
                                       int64_t count) const {
  // The local tensor as [rows, cols] (dims after the first fold into cols), placed in the
  // stored one at (row0, col0), of which rows [0, valid_rows) are stored.
  SLIMPI_CHECK(local.size() <= 2, "tensor {} has {} dimensions: per-rank checkpoint I/O handles tensors of at most 2",
               name, local.size());
  const int64_t rows = local.empty() ? 1 : local[0], cols = local.size() == 2 ? local[1] : 1;
  SLIMPI_CHECK(begin >= 0 && count >= 0 && begin + count <= rows * cols, "elements [{}, {}) of tensor {} of {} "
               "elements", begin, begin + count, name, rows * cols);
  Span span;
  span.whole = whole_shape(name, local);
  int64_t row0 = 0, col0 = 0, valid_rows = rows;
  const ParameterSplit split = active() ? parameter_split(name, *cfg, shard.size) : ParameterSplit{};
  if (split.split() && split.dim < int(local.size())) {
    const int64_t first = (split.dim == 0 ? rows : cols) * split.part_of_rank(shard.rank);  // of the padded whole
    if (split.dim == 0) {
      row0 = first;
      valid_rows = std::clamp<int64_t>(split.whole - first, 0, rows);
    } else {
      col0 = first;
    }
  }
  span.stored = std::clamp<int64_t>(valid_rows * cols - begin, 0, count);
  if (span.stored == 0) return span;
  const int64_t end = begin + span.stored;  // the stored run [begin, end)
  const int64_t r0 = begin / cols, c0 = begin % cols, r1 = (end - 1) / cols, c1 = (end - 1) % cols;
  auto add = [&](int64_t r, int64_t c, int64_t nr, int64_t nc) {
    if (nr > 0 && nc > 0) span.blocks.push_back({row0 + r, col0 + c, nr, nc});
  };
  if (r0 == r1) {
    add(r0, c0, 1, c1 - c0 + 1);
  } else if (c0 == 0 && c1 == cols - 1) {
    add(r0, 0, r1 - r0 + 1, cols);
  } else {
    const int64_t full_from = c0 == 0 ? r0 : r0 + 1, full_to = c1 == cols - 1 ? r1 : r1 - 1;  // whole rows
    if (c0 != 0) add(r0, c0, 1, cols - c0);
    add(full_from, 0, full_to - full_from + 1, cols);
    if (c1 != cols - 1) add(r1, 0, 1, c1 + 1);
  }
  return span;
}

void check_tensor_parallel_shape(const ModelConfig& cfg, int t) {
  if (t <= 1) return;
  SLIMPI_CHECK(!cfg.is_hybrid() || cfg.linear_num_key_heads % t == 0, "tensor parallelism over {} ranks splits a "
               "hybrid model's Gated DeltaNet layers by key heads: the model has {} (linear_num_key_heads), not "
               "divisible by {}", t, cfg.linear_num_key_heads, t);
  SLIMPI_CHECK(cfg.n_heads % t == 0, "tensor parallelism over {} ranks splits attention by heads: the model has {} "
               "query heads, not divisible by {}", t, cfg.n_heads, t);
  SLIMPI_CHECK(cfg.n_kv_heads % t == 0 || t % cfg.n_kv_heads == 0, "tensor parallelism over {} ranks splits "
               "attention by heads: the model has {} key/value heads, which {} neither divides nor is divisible by "
               "(key/value heads are split, or replicated over a group larger than their number)", t, cfg.n_kv_heads,
               t);
  SLIMPI_CHECK(cfg.intermediate_size % t == 0, "tensor parallelism over {} ranks splits the MLP: intermediate_size "
               "{} is not divisible by {}", t, cfg.intermediate_size, t);
  SLIMPI_CHECK(cfg.shared_experts_width() % t == 0 && cfg.shared_expert_intermediate_size % t == 0,
               "tensor parallelism over {} ranks splits the shared experts as a dense MLP: their width (n_shared_experts "
               "x moe_intermediate_size = {}, shared_expert_intermediate_size = {}) is not divisible by {}", t,
               cfg.shared_experts_width(), cfg.shared_expert_intermediate_size, t);
}

}  // namespace slimpi
