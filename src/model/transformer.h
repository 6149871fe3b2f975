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
// Both run the same layer loop (forward()): per layer an attention block (RMSNorm, q/k/v
// projections, optional q/k norms, RoPE, attention of model/attention.h, optional output
// gate, output projection; or, in a hybrid model's linear layers, a Gated DeltaNet block,
// model/transformer_linear.cpp, whose state an incremental forward keeps in the KvCache's
// state slots) and an MLP block (SwiGLU, or the MoE layer of model/moe.h), each added to
// the residual stream; attention differs only in where keys/values come from.
// Precision: weights are stored in fp32 (the trainer's masters) or bf16 (a bf16 rollout
// engine); drawn in fp32 either way and rounded once. The residual stream, RMSNorm,
// attention softmax and the logits are fp32 whatever the weights; matrix products run
// in the precision of the caller's ForwardPrecision (model/precision.h).
// Tensor parallelism (model/tensor_shard.h): a shard holds its heads, MLP columns and
// vocabulary rows; attention and the dense MLP are Megatron's column-parallel layers
// (input through copy_to_tp) followed by a row-parallel one (output through
// reduce_from_tp), the embedding is vocab-parallel (each shard looks up its rows, the
// rest are zero, reduce_from_tp sums), the LM head gives this shard's vocabulary
// columns of the logits; an MoE layer's router and routed experts run whole on every
// shard (expert parallelism splits the experts), its shared experts split as the dense
// MLP. Every forward is then collective over the tensor-parallel group.
// Context parallelism (model/context_split.h): a packed forward runs this rank's chunks of
// every sequence, attention reading the group's keys; its outputs are this rank's rows
// (context_split(seq_lens)->local_rows()), its MoE trace the whole batch's.
// Pipeline parallelism (model/pipeline_shard.h): a stage holds its layers (the first the
// embedding, the last the final norm and head) and runs them in forward_packed_stage.
// Invariant: parameters are created in name order from one generator seeded by the
// run seed, so the same config and seed give bit-identical weights on any device (and,
// sharded, the same numbers in each shard's slice).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "core/named_tensor.h"
#include "model/attention.h"
#include "model/context_split.h"
#include "model/kv_cache.h"
#include "model/model_config.h"
#include "model/moe.h"
#include "model/pipeline_shard.h"
#include "model/tensor_shard.h"

namespace slimpi {

// The expert choices of the MoE layers in one forward (model.n_experts > 0): what the
// engine records as routing traces, what a trainer replays (Rollout Routing Replay), and
// the router logits the auxiliary losses need.
// A pipeline stage's forward records its own MoE layers only (L_s of them, in order; none
// on a stage of dense layers): `replay` stays the whole model's.
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
    // Multi-head latent attention (q is q_b_proj, or q_proj without a query latent).
    at::Tensor q_a, q_a_norm, kv_a, kv_a_norm, kv_b;
    // A Gated DeltaNet layer (model/transformer_linear.cpp; no q/k/v/o then): in_proj_qkv
    // [2·Hk·Dk + Hv·Dv, d], in_proj_z [Hv·Dv, d], in_proj_b / in_proj_a [Hv, d], conv1d
    // [conv_dim, K] (Hugging Face's [conv_dim, 1, K] without its unit dimension), dt_bias /
    // A_log [Hv], the gated norm [Dv], out_proj [d, Hv·Dv];
    // Qwen3-Next's fused layout (ModelConfig::linear_fused_projections): lin_qkv is in_proj_qkvz,
    // lin_b in_proj_ba, lin_z and lin_a undefined.
    // linear_index: its place among the model's linear layers (its KvCache state), -1 if none.
    at::Tensor lin_qkv, lin_z, lin_b, lin_a, lin_conv, lin_dt_bias, lin_a_log, lin_norm, lin_out;
    int64_t linear_index = -1;
    MoeWeights moe;
  };

  // weights: the storage dtype of the parameters (kFloat or kBFloat16). experts: the
  // routed experts this model holds (expert parallelism, model/moe.h: a shard holds
  // only its block's "mlp.experts.<e>." parameters, the same values the whole model has
  // for them; every forward is then collective over the shard's group). tensor: its
  // place in a tensor-parallel group (model/tensor_shard.h).
  // context: its place in a context-parallel group (forward_packed* and forward_mtp_packed
  // are then collective over it). pipeline: its stage (model/pipeline_shard.h).
  Transformer(const ModelConfig& cfg, uint64_t seed, const at::Device& device,
              at::ScalarType weights = at::kFloat, const ExpertShard& experts = {}, const TensorShard& tensor = {},
              const ContextShard& context = {}, const PipelineShard& pipeline = {});

  const ModelConfig& config() const { return cfg_; }
  const ExpertShard& expert_shard() const { return experts_; }
  const TensorShard& tensor_shard() const { return tensor_; }
  const ContextShard& context_shard() const { return context_; }
  const PipelineShard& pipeline_shard() const { return pipeline_; }
  // The split of a packed batch of these sequence lengths over the context-parallel
  // group (null without context parallelism): which rows a packed forward returns.
  std::shared_ptr<const ContextSplit> context_split(const std::vector<int64_t>& seq_lens) const;
  // Whether any parameter is a shard of the whole model's, or missing (tensor, expert or
  // pipeline parallelism).
  bool sharded() const { return tensor_.size > 1 || experts_.size > 1 || pipeline_.size > 1; }
  // The vocabulary columns of this shard's logits: [vocab_begin, vocab_begin + logit
  // columns) of the padded vocabulary; the first n_real_vocab of them are real tokens.
  int64_t vocab_begin() const { return vocab_begin_; }
  int64_t n_real_vocab() const { return n_real_vocab_; }
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
  // without padding (and, for Gated DeltaNet layers, padded q/k/v channels, B · longest ·
  // conv_dim, above which each sequence runs alone). Default kPaddedAttentionBudget; 0 =
  // always unpadded.
  static constexpr int64_t kPaddedAttentionBudget = int64_t(1) << 22;
  int64_t padded_attention_budget() const { return padded_attention_budget_; }
  void set_padded_attention_budget(int64_t elements) { padded_attention_budget_ = elements; }
  // Whether an incremental batch with decode rows and prefill chunks attends in two
  // calls (default) or as one batch padded to the longest chunk (perf/ compares them).
  void set_split_decode_and_prefill(bool split) { split_decode_and_prefill_ = split; }
  // How the decode rows (one new token each) of an incremental batch read the cache
  // (model/attention.h). All give the same outputs to fp32 round-off (tested).
  using DecodeAttention = ::slimpi::DecodeAttention;
  // Activation recomputation of training forwards (train.recompute, model/recompute.h):
  // Selective recomputes attention's inner products, Full each layer's attention block
  // and dense MLP (an MoE layer's experts keep their activations). Same gradients.
  enum class Recompute { None, Selective, Full };
  void set_recompute(Recompute mode) { recompute_ = mode; }
  void set_decode_attention(DecodeAttention mode) { decode_attention_ = mode; }
  // Multi-head latent attention in incremental forwards: the latent cache and the absorbed
  // form (default), or the expanded keys and values cached per head (a KvCache allocated
  // with latent = false; perf/ compares the two). The same outputs to fp32 round-off.
  void set_latent_cache(bool latent) { latent_cache_ = latent; }
  // Sets every weight to `other`'s (same config), converting the dtype: a bf16 rollout
  // copy of the fp32 policy on a colocated rank. No gradient is tracked.
  void copy_weights_from(const Transformer& other);
  // Sets a tensor shard's weights (no expert sharding) to its part of `whole`, the same
  // config unsharded (any weight dtype).
  void copy_shard_from(const Transformer& whole);

  // tokens [T] int64 (B sequences back to back, lengths seq_lens) -> logits [T, V] fp32
  // ([T, Vp / t], this shard's vocabulary columns, under tensor parallelism; [T_i, .],
  // this rank's rows, under context parallelism).
  // moe (MoE models): replays and/or records the routing of every token (all T rows,
  // gathered over a context-parallel group; the router logits' gradient reaches each
  // rank's own rows).
  at::Tensor forward_packed(const at::Tensor& tokens, const std::vector<int64_t>& seq_lens,
                            MoeTrace* moe = nullptr) const;
  // The same forward up to the LM head: the final norm's output [T, d] fp32, the LM
  // head's input (every token's, also under sequence parallelism; this rank's rows
  // [T_i, d] under context parallelism), for a loss that
  // takes the head's product itself (model/head_log_probs.h).
  at::Tensor forward_packed_hidden(const at::Tensor& tokens, const std::vector<int64_t>& seq_lens,
                                   MoeTrace* moe = nullptr) const;
  // The LM head's weight [V, d] (this shard's rows [Vp / t, d]; the embedding when tied).
  const at::Tensor& lm_head() const { return lm_head_; }

  // Pipeline parallelism: this stage's part of forward_packed_hidden. input: the tokens [T]
  // (int64) on the first stage, the previous stage's output elsewhere; returns the residual
  // stream after this stage's layers [stage_rows(seq_lens), d] fp32, or on the last stage
  // the final norm's output (forward_packed_hidden's). moe: the trace of this stage's MoE
  // layers (MoeTrace; all T rows under context parallelism, as forward_packed's). Also the
  // whole forward at one stage.
  at::Tensor forward_packed_stage(const at::Tensor& input, const std::vector<int64_t>& seq_lens,
                                  MoeTrace* moe = nullptr) const;
  // The rows of the residual stream between stages for a batch of these sequences: the
  // tokens (this rank's under context parallelism; padded and split under sequence
  // parallelism).
  int64_t stage_rows(const std::vector<int64_t>& seq_lens) const;

  // tokens [T_new] int64, the new tokens of each sequence back to back -> logits
  // [T_new, V] fp32. Writes the new tokens' keys/values into `cache` at their slots.
  // hidden: when given, set to the final norm's output [T_new, d] fp32 (the LM head's
  // input, and the first MTP depth's). to_logits = false: the final norm's output is
  // returned instead of the logits (a prefill engine needs only the keys and values).
  // logit_rows [R] int64 (defined): the LM head runs on those rows only -> logits [R, V]
  // (an engine samples from a prompt's last position, not from every one).
  at::Tensor forward_incremental(const at::Tensor& tokens, const std::vector<CachedSequence>& seqs,
                                 KvCache& cache, MoeTrace* moe = nullptr, at::Tensor* hidden = nullptr,
                                 bool to_logits = true, const at::Tensor& logit_rows = {}) const;

  // Multi-token prediction (model.mtp_num_layers > 0; DeepSeek-V3's MTP modules as MiMo
  // ships them). Depth i at position j reads in[j] (the previous depth's output there;
  // for depth 0 the trunk's final-norm output, forward_packed_hidden) and next[j], the
  // token i + 1 places after position j, and returns its output [T, d] fp32 (its final
  // norm: the LM head's input, whose logits predict the token i + 2 places after j, and
  // the next depth's `in`). The embedding is read detached; `in` is as the caller gives
  // it (detached: the MTP loss trains the MTP layers alone). Positions as the trunk's.
  // Under context parallelism `in` and the output are this rank's rows [T_i, d] (`next`
  // is every row's [T]).
  int64_t n_mtp_layers() const { return int64_t(mtp_.size()); }
  at::Tensor forward_mtp_packed(int64_t depth, const at::Tensor& in, const at::Tensor& next,
                                const std::vector<int64_t>& seq_lens) const;
  // The same through the paged KV cache (its layer n_layers + depth): a draft's forward.
  at::Tensor forward_mtp_incremental(int64_t depth, const at::Tensor& in, const at::Tensor& next,
                                     const std::vector<CachedSequence>& seqs, KvCache& cache) const;
  // hidden [T, d] -> logits [T, V] fp32 ([T, Vp / t] under tensor parallelism) by the LM
  // head, read detached (the draft's logits from an MTP depth's output).
  at::Tensor head_logits(const at::Tensor& hidden) const;

 private:
  // The layer loop of both forwards: embedding, per layer an attention block and an MLP
  // (dense or MoE) block on the fp32 residual stream, final norm, logits. Under pipeline
  // parallelism the stage's part: `tokens` is the residual stream [rows, d] unless this
  // is the first stage, and a stage before the last returns its residual stream.
  at::Tensor forward(const at::Tensor& tokens, const AttentionLayout& layout, KvCache* cache, MoeTrace* moe,
                     bool to_logits = true, at::Tensor* hidden = nullptr, const at::Tensor& logit_rows = {}) const;
  struct ForwardContext;
  // The context of one forward over `layout` (T tokens): parallelism, precision, the
  // attention plan, RoPE at every position.
  ForwardContext context(const AttentionLayout& layout, KvCache* cache, int64_t T, bool sequence_parallel) const;
  at::Tensor mtp_depth(int64_t depth, const at::Tensor& in, const at::Tensor& next, const AttentionLayout& layout,
                       KvCache* cache) const;
  void check_packed(const at::Tensor& tokens, const std::vector<int64_t>& seq_lens) const;
  // A packed forward under context parallelism from this rank's rows of its input (the
  // tokens, or a later stage's residual stream): this rank's rows, the trace gathered.
  at::Tensor forward_split(const at::Tensor& local_input, const std::shared_ptr<const ContextSplit>& split,
                           MoeTrace* moe, bool to_logits) const;
  // Per layer: x [T, d] -> the attention block's output [T, d] (added to x by the caller).
  // tokens [T] -> their embedding rows [T, d] fp32 (vocab-parallel under tensor parallelism).
  at::Tensor embed(const at::Tensor& tokens, const ForwardContext& f, const at::Tensor& weight) const;
  // cache_layer: the KV cache's layer this block reads and writes (an MTP depth i: n_layers + i).
  at::Tensor attention_block(const LayerParams& p, int64_t cache_layer, const at::Tensor& x,
                             const ForwardContext& f) const;
  // q [T, H, D], k/v [T, Hkv, D] (this shard's heads) -> attention [T, H * D] (through the
  // cache when the forward has one; recomputed in backward under selective recomputation).
  at::Tensor attend_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t cache_layer,
                          const ForwardContext& f) const;
  // attention [T, H * Dv] -> o_proj's output [T_local, d] (row-parallel under tensor parallelism).
  at::Tensor output_projection(const LayerParams& p, const at::Tensor& attn, const ForwardContext& f) const;
  // The same block as multi-head latent attention (model/transformer_mla.cpp).
  at::Tensor latent_attention_block(const LayerParams& p, int64_t cache_layer, const at::Tensor& x,
                                    const ForwardContext& f) const;
  // The engine's form of it: the latent cache and W_UK / W_UV absorbed (transformer_mla.cpp).
  // q_nope [T, H, nope], q_rot [T, H, R] (RoPE applied), latent [T, r] (normalised), k_rot [T, 1, R].
  at::Tensor absorbed_attention(const LayerParams& p, int64_t cache_layer, const at::Tensor& q_nope,
                                const at::Tensor& q_rot, const at::Tensor& latent, const at::Tensor& k_rot,
                                const ForwardContext& f) const;
  // The token mixer of a Gated DeltaNet layer (model/transformer_linear.cpp): x [T_local, d]
  // -> [T_local, d], the chunked delta rule over every sequence (training, prefill), the recurrent
  // step for decode rows, through the cache's state slots when the forward has a cache.
  at::Tensor linear_attention_block(const LayerParams& p, const at::Tensor& x, const ForwardContext& f) const;
  // The same up to out_proj over the sequences of one layout (a part of an incremental
  // batch): h [T_l, d] -> the gated norm's output [T_l, Hv·Dv] (this rank's value heads,
  // fp32); norm: the gated norm's weight as this forward applies it.
  at::Tensor linear_attention(const LayerParams& p, const at::Tensor& norm, const at::Tensor& h,
                              const AttentionLayout& a, KvCache* cache) const;
  // x [T_local, d] -> x + the dense MLP block of `layer`.
  at::Tensor dense_mlp_residual(const LayerParams& p, const at::Tensor& x, const ForwardContext& f) const;
  // An MoE block's output rows (this rank's under sequence parallelism): the routed
  // experts' `routed` [T, d] (every token, run whole on every rank of a tensor group) plus
  // the shared experts over h (the post-norm rows, [T_own, d]), split as a dense MLP is
  // (column-parallel gate/up, row-parallel down), then Qwen2-MoE's σ(h · g).
  at::Tensor moe_residual(const MoeWeights& w, const at::Tensor& routed, const at::Tensor& h,
                          const ForwardContext& f) const;
  // Appends parameter `name` (drawn as `t`); `binds_to` is the member that holds it
  // once pack_parameters() gave it its final storage.
  void add(const std::string& name, at::Tensor t, at::Tensor* binds_to);
  // Moves every parameter into flat_ (called once, before any view is taken).
  void pack_parameters();

  ModelConfig cfg_;
  at::Device device_;
  at::ScalarType weights_;
  ExpertShard experts_;
  TensorShard tensor_;
  ContextShard context_;
  PipelineShard pipeline_;
  int64_t vocab_begin_ = 0, n_real_vocab_ = 0;
  int64_t padded_attention_budget_ = kPaddedAttentionBudget;
  bool split_decode_and_prefill_ = true;
  Recompute recompute_ = Recompute::None;
  DecodeAttention decode_attention_ = DecodeAttention::Auto;
  bool latent_cache_ = true;
  std::vector<NamedTensor> params_;
  std::vector<at::Tensor*> bindings_;  // during construction: where params_[i] binds
  at::Tensor flat_;  // [n_params] every parameter's storage
  std::vector<LayerParams> layers_;
  // One MTP depth: its token and hidden norms, input projection [d, 2d] (hidden columns
  // first), a transformer layer (dense; an MoE layer when cfg_.mtp_is_moe()), its final norm.
  struct MtpParams {
    at::Tensor token_norm, hidden_norm, input_proj, final_norm;
    LayerParams block;
  };
  std::vector<MtpParams> mtp_;
  at::Tensor embed_, final_norm_, lm_head_;
  at::Tensor rope_cos_, rope_sin_;  // [max_seq_len, R], R = cfg.rotary_dim()
  MoeRouting routing_;              // the MoE layers' router (model/moe.h)
};

}  // namespace slimpi
