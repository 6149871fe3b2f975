// Transformer — the decoder-only policy (Llama / Qwen2 / Qwen3 family, and their Qwen2-MoE /
// Qwen3-MoE mixture-of-experts variants, model/moe.h) that the trainer and the rollout
// engine both run: one implementation, so their log-probs agree.
//
// The model is a fixed, ordered list of named parameters (Hugging Face names, e.g.
// "model.layers.0.self_attn.q_proj.weight") and two forwards over *packed* sequences
// (no padding: the tokens of B sequences back to back, T in all):
//   forward_packed       full sequences, positions from 0, block-diagonal causal
//                        attention (training, log-prob recomputation)
//   forward_incremental  new tokens of B sequences that attend to their cached past;
//                        writes the new keys/values into a KvCache at given slots
//                        (prefill chunks and decode steps of the rollout engine)
// Both run the same layer code; attention differs only in where keys/values come from.
// Attention of packed sequences (training, log-prob recomputation) and of the prefill
// chunks of the incremental forward runs each sequence alone through torch's
// scaled_dot_product_attention (flash kernels: no padding, no O(B · longest²) scores)
// once a padded batch's scores would exceed padded_attention_budget() elements; below
// that the sequences' queries and keys are scattered into padded [B, L, heads, D]
// tensors, masked (causal and past each sequence's end) and gathered back: a few large
// ops, faster for many short sequences. Decode rows (one new token) read the cache as
// set_decode_attention() says (a paged kernel on the CPU). Every path gives the same
// outputs (and, for packed sequences, gradients) to fp32 round-off (tested).
// Precision: weights are stored in fp32 (the trainer's masters) or bf16 (a bf16 rollout
// engine); drawn in fp32 either way and rounded once. The residual stream, RMSNorm,
// attention softmax and the logits are fp32 whatever the weights; matrix products run
// in the precision of the caller's ForwardPrecision (model/precision.h).
// Invariant: parameters are created in name order from one generator seeded by the
// run seed, so the same config and seed give bit-identical weights on any device.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "io/named_tensor.h"
#include "model/model_config.h"
#include "model/moe.h"

namespace slimpi {

// Keys and values of every layer, addressed by slot (a slot holds one token's K and V
// for all KV heads). Slot assignment (contiguous per sequence, or paged blocks) is
// the caller's business.
struct KvCache {
  std::vector<at::Tensor> k;  // n_layers x [n_slots, n_kv_heads, D]
  std::vector<at::Tensor> v;  // n_layers x [n_slots, n_kv_heads, D]
  // Gathered keys/values of the sequences one attention call reads (the Gather decode
  // path, and prefill chunks with a cached past): [rows, n_kv_heads, D] each, re-used by
  // every layer and step, grown only when a call needs more rows.
  at::Tensor gathered_k, gathered_v;
  // Mixture-of-experts policies: the experts each slot's token ran, kept with its K/V so
  // that tokens served from the prefix cache still have their routing trace.
  at::Tensor routing;  // [n_slots, n_moe_layers, k] int16 (undefined for dense models)
  static KvCache allocate(const ModelConfig& cfg, int64_t n_slots, const at::TensorOptions& options);
  int64_t n_slots() const { return k.empty() ? 0 : k[0].size(0); }
};

// One sequence of an incremental batch: n_new tokens after n_past cached ones.
struct CachedSequence {
  int64_t n_past = 0;
  int64_t n_new = 0;
  at::Tensor slots;  // [n_past + n_new] int64: the cache slot of every position 0..n_past+n_new-1
};

// The expert choices of the MoE layers in one forward (model.n_experts > 0): what the
// engine records as routing traces, what a trainer replays (Rollout Routing Replay), and
// the router logits the auxiliary losses need.
struct MoeTrace {
  at::Tensor replay;                      // in, optional: [T, n_moe_layers, k] int64 experts to run (-1: route)
  at::Tensor chosen;                      // out: [T, n_moe_layers, k] int64 experts each token ran
  at::Tensor routed;                      // out: [T, n_moe_layers, k] the routers' own top-k
  std::vector<at::Tensor> router_logits;  // out: n_moe_layers x [T, E] fp32, with autograd
};

class Transformer {
 public:
  // The tensors of one block (views of parameters(); bias tensors undefined when off;
  // a sparse layer has moe set and no dense gate/up/down).
  struct LayerParams {
    at::Tensor input_norm, q, k, v, q_bias, k_bias, v_bias, o, o_bias, q_norm, k_norm, post_norm, gate, up, down;
    MoeWeights moe;
  };

  // weights: the storage dtype of the parameters (kFloat or kBFloat16). experts: the
  // routed experts this model holds (expert parallelism, model/moe.h: a shard holds
  // only its block's "mlp.experts.<e>." parameters, the same values the whole model has
  // for them; every forward is then collective over the shard's group).
  Transformer(const ModelConfig& cfg, uint64_t seed, const at::Device& device,
              at::ScalarType weights = at::kFloat, const ExpertShard& experts = {});

  const ModelConfig& config() const { return cfg_; }
  const ExpertShard& expert_shard() const { return experts_; }
  // Whether a parameter is one routed expert's (sharded by expert parallelism).
  static bool is_expert_parameter(const std::string& name);
  const std::vector<NamedTensor>& parameters() const { return params_; }
  // Every parameter is a view of this one buffer [n_params] (weights dtype; in parameters()
  // order, back to back): the weight sync broadcasts it in place, without packing.
  const at::Tensor& flat_parameters() const { return flat_; }
  at::Tensor& parameter(const std::string& name);
  int64_t n_params() const;
  at::Device device() const { return device_; }
  at::ScalarType weight_dtype() const { return weights_; }
  // Padded-attention scores (B · heads · longest²) above which packed sequences attend
  // without padding. Default kPaddedAttentionBudget; 0 = always unpadded.
  static constexpr int64_t kPaddedAttentionBudget = int64_t(1) << 22;
  int64_t padded_attention_budget() const { return padded_attention_budget_; }
  void set_padded_attention_budget(int64_t elements) { padded_attention_budget_ = elements; }
  // Whether an incremental batch with decode rows and prefill chunks attends in two
  // calls (default) or as one batch padded to the longest chunk (perf/ compares them).
  void set_split_decode_and_prefill(bool split) { split_decode_and_prefill_ = split; }
  // How the decode rows (one new token each) of an incremental batch read the cache:
  //   Paged        the host paged-attention kernel reads each K/V row where it lies
  //                (kernels/paged_attention.h)
  //   Gather       the rows are gathered into the KvCache's reused buffer, then one
  //                batched attention (any device)
  //   FreshGather  a new padded copy of every sequence's history, per layer and step
  //                (the code before the paged kernel; kept for perf/ to compare against)
  //   Auto         Paged for an fp32 forward on the CPU; otherwise Gather (the default:
  //                a bf16 forward then runs the attention ops a bf16 trainer runs)
  // All give the same outputs to fp32 round-off (tested).
  enum class DecodeAttention { Auto, Paged, Gather, FreshGather };
  void set_decode_attention(DecodeAttention mode) { decode_attention_ = mode; }
  // Sets every weight to `other`'s (same config), converting the dtype: a bf16 rollout
  // copy of the fp32 policy on a colocated rank. No gradient is tracked.
  void copy_weights_from(const Transformer& other);

  // Where each token sits in the padded attention batch and where its keys come from.
  struct AttentionLayout;

  // tokens [T] int64 (B sequences back to back, lengths seq_lens) -> logits [T, V] fp32.
  // moe (MoE models): replays and/or records the routing of every token.
  at::Tensor forward_packed(const at::Tensor& tokens, const std::vector<int64_t>& seq_lens,
                            MoeTrace* moe = nullptr) const;

  // tokens [T_new] int64, the new tokens of each sequence back to back -> logits
  // [T_new, V] fp32. Writes the new tokens' keys/values into `cache` at their slots.
  at::Tensor forward_incremental(const at::Tensor& tokens, const std::vector<CachedSequence>& seqs,
                                 KvCache& cache, MoeTrace* moe = nullptr) const;

 private:
  at::Tensor forward(const at::Tensor& tokens, const AttentionLayout& layout, KvCache* cache, MoeTrace* moe) const;
  void add(const std::string& name, at::Tensor t);
  // Moves every parameter into flat_ (called once, before any view is taken).
  void pack_parameters();

  ModelConfig cfg_;
  at::Device device_;
  at::ScalarType weights_;
  ExpertShard experts_;
  int64_t padded_attention_budget_ = kPaddedAttentionBudget;
  bool split_decode_and_prefill_ = true;
  DecodeAttention decode_attention_ = DecodeAttention::Auto;
  std::vector<NamedTensor> params_;
  at::Tensor flat_;  // [n_params] every parameter's storage
  std::vector<LayerParams> layers_;
  at::Tensor embed_, final_norm_, lm_head_;
  at::Tensor rope_cos_, rope_sin_;  // [max_seq_len, D]
};

}  // namespace slimpi
