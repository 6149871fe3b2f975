// TensorShard — a model's place in a tensor-parallel group (parallel.tensor_parallel = t),
// and how Megatron's layers split each parameter over the group.
//
// Rank r of t holds, of every dense layer (Megatron's column- and row-parallel layers):
//   q_proj / k_proj / v_proj (and biases)   rows: query heads [r·H/t, (r+1)·H/t) and
//                                           key/value heads [r·Hkv/t, (r+1)·Hkv/t);
//                                           when t > Hkv, each key/value head is held
//                                           whole by t/Hkv consecutive ranks (its
//                                           replicas: rank r holds head r·Hkv/t, the
//                                           one its query heads attend with), and the
//                                           replicas sum their k/v gradients
//   o_proj                                  columns: the same query heads
//   mlp.gate_proj / mlp.up_proj             rows [r·F/t, (r+1)·F/t): each shard its own
//                                           gate and up halves
//   mlp.down_proj                           columns: the same F/t
//   embed_tokens / lm_head                  vocabulary rows [r·Vp/t, (r+1)·Vp/t), the
//                                           vocabulary V padded with zero rows to Vp, a
//                                           multiple of 128·t (padded rows are masked out
//                                           of every softmax and never exported)
//   mlp.shared_expert(s).{gate,up,down}     as the dense MLP: the shared experts' width / t
//   linear_attn.* (a hybrid model's Gated   key heads [r·Hk/t, (r+1)·Hk/t) and the value
//   DeltaNet layers)                        heads that read them: in_proj_qkv's rows and
//                                           conv1d's channels (grouped by key head:
//                                           model/linear_channels.h), Qwen3-Next's
//                                           in_proj_qkvz / in_proj_ba rows (grouped in
//                                           its files), in_proj_z/b/a rows, dt_bias and
//                                           A_log; out_proj's columns; norm whole
// Everything else (norms, o_proj's bias, MoE routers and routed experts, which expert
// parallelism shards instead) is replicated. At t = 1 nothing is split or padded.
// Shards keep the whole model's parameter names; a shard's values are exactly the
// whole tensor's rows or columns (the model draws every whole tensor, then keeps its
// slice), so a sharded model and a whole one of the same seed hold the same numbers.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace slimpi {

class Comm;
struct ModelConfig;

struct TensorShard {
  int rank = 0, size = 1;  // place in the tensor-parallel group, its size (1: whole layers)
  Comm* comm = nullptr;    // the group (required when size > 1)
  // Megatron's sequence parallelism (parallel.sequence_parallel, size > 1): between the
  // layers' column- and row-parallel products (norms, residual adds) each rank holds
  // 1/t of the tokens (the stream padded to a multiple of t); all-gathers over the
  // sequence enter a layer and reduce-scatters leave it, and the norm weights'
  // gradients are summed over the group.
  bool sequence_parallel = false;
  // t > Hkv (key/value heads replicated, kv_head_replicas > 1): the ranks of the group
  // holding the same key/value heads, over which their k/v gradients are summed. Needed
  // by a forward that tracks gradients; engines run without it.
  Comm* kv_replicas = nullptr;
};

// How many consecutive ranks of a tensor group of t hold the same key/value heads: 1
// when t divides Hkv, t / Hkv when Hkv divides t (the heads replicated).
int kv_head_replicas(const ModelConfig& cfg, int t);
// Key/value heads a rank of a tensor group of t holds (Hkv / t, or 1 when replicated).
int64_t local_kv_heads(const ModelConfig& cfg, int t);
// One token's row of a layer's KV cache on each rank of an engine of t ranks: key/value
// heads and their dimension (keys and values alike), and how many such rows a token
// takes a layer (2: keys and values). Multi-head latent attention caches its latent
// instead: one row of kv_lora_rank + qk_rope_head_dim values (the normalised latent and
// the rotary key), shared by every head, held whole by every rank, and read as the values
// too (their first kv_lora_rank columns are the latent): 1 row a layer
// (model/transformer_mla.cpp, KvCache::values_are_keys).
struct KvCacheRow {
  int64_t heads = 0, dim = 0;
  int64_t rows = 2;
};
// latent = false: MLA's expanded keys and values instead (each head's, values zero-padded
// to the key width; Transformer::set_latent_cache(false), which perf/ compares against).
KvCacheRow kv_cache_row(const ModelConfig& cfg, int t, bool latent = true);

// A Gated DeltaNet layer's heads on each rank of a tensor group of t (t divides the key
// heads): key heads Hk / t, value heads Hv / t, convolved q/k/v channels C / t.
struct LinearHeads {
  int64_t key_heads = 0, value_heads = 0, conv_dim = 0;
};
LinearHeads local_linear_heads(const ModelConfig& cfg, int t);

// Vocabulary rows of the embedding and LM head at tensor-parallel size t: V at t = 1,
// else V rounded up to a multiple of 128 · t (Megatron's make-vocab-size-divisible-by).
int64_t padded_vocab_size(int64_t vocab_size, int t);

// How one parameter (its whole-model name, optionally behind an "exp_avg/"-style prefix)
// splits: along `dim` (-1: replicated), of whole size `whole` along it, padded to
// `padded` (> whole only for the vocabulary rows), into t / replicas parts, each held
// by `replicas` consecutive ranks (> 1 only for replicated key/value heads).
struct ParameterSplit {
  int dim = -1;
  int64_t whole = 0, padded = 0;
  int replicas = 1;
  bool split() const { return dim >= 0; }
  // The part rank r of t holds, and that part's extent along dim (of the padded whole).
  int part_of_rank(int rank) const { return rank / replicas; }
  int64_t part_extent(int t) const { return padded / (t / replicas); }
  // Whether rank r is the first of its part's replicas (the one that stores it).
  bool first_replica(int rank) const { return rank % replicas == 0; }
};
ParameterSplit parameter_split(const std::string& name, const ModelConfig& cfg, int t);

// The shard's part of a whole tensor (padded first where the split pads): a new tensor.
at::Tensor shard_of_whole(const at::Tensor& whole, const ParameterSplit& split, const TensorShard& shard);

// The whole tensor from every shard's part stacked in rank order ([t, *part.shape]),
// padding dropped (of replicated parts, the first replica's).
at::Tensor whole_of_shards(const at::Tensor& stacked, const ParameterSplit& split);

// A shard's tensors as files store them (checkpoints, Hugging Face directories): whole,
// under the whole model's names. Inactive (cfg null or one rank): tensors are stored
// as held.
struct StoredWhole {
  const ModelConfig* cfg = nullptr;
  TensorShard shard;
  bool active() const { return cfg && shard.size > 1; }
  // The stored shape of the local tensor `name` of shape `local`.
  std::vector<int64_t> whole_shape(const std::string& name, const std::vector<int64_t>& local) const;
  // This shard's part of the stored tensor `name`.
  at::Tensor part_of(const std::string& name, const at::Tensor& whole) const;
  // Where elements [begin, begin + count) of the local tensor `name` (shape `local`,
  // row-major) lie in the stored tensor (span_of below).
  struct Span;
  Span span_of(const std::string& name, const std::vector<int64_t>& local, int64_t begin, int64_t count) const;
};

// A run of a local tensor's elements as blocks of the stored tensor, in the order of the
// local elements: per-rank hyperslab I/O (io/tensor_pieces.h). Blocks are in the
// stored tensor's own coordinates (rows: dim 0, cols: dim 1; a 1-D tensor has one
// column, a 0-D one is one element); under a column split a run of rows becomes at
// most three blocks (a partial row, whole rows, a partial row). `stored` counts the
// run's elements that are stored: the first `stored` ones; the rest are the padded
// vocabulary rows at the end of the last shards, which files never hold.
struct StoredWhole::Span {
  std::vector<int64_t> whole;  // the stored tensor's shape
  struct Block {
    int64_t row = 0, col = 0, rows = 0, cols = 0;
  };
  std::vector<Block> blocks;
  int64_t stored = 0;
};

// Whether `shard`'s rank is the first of its tensor group to hold its part of parameter
// (or moment, "exp_avg/<parameter>") `name`: the rank that writes it to a checkpoint
// (tensor rank 0 for a tensor every rank holds whole; the first replica of a key/value head).
bool first_holder(const std::string& name, const ModelConfig& cfg, const TensorShard& shard);

// Refuses (slimpi::Error, with the numbers) a model that cannot split over t ranks:
// query heads, the MLP width or a hybrid model's linear key heads not divisible by t,
// key/value heads neither divisible by t nor dividing it.
void check_tensor_parallel_shape(const ModelConfig& cfg, int t);

}  // namespace slimpi
