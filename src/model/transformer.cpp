#include "model/transformer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <slimpi/error.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <tuple>

#include "kernels/batch_invariant.h"
#include "kernels/small_batch_linear.h"
#include "parallel/comm.h"
#include "model/forward_context.h"
#include "model/recompute.h"
#include "parallel/tp_mappings.h"

namespace slimpi {

void Transformer::add(const std::string& name, at::Tensor t, at::Tensor* binds_to) {
  if (!pipeline_.holds(name, cfg_.n_layers, last_stage_copies_embedding(cfg_))) return;  // another stage's
  if (tensor_.size > 1) t = shard_of_whole(t, parameter_split(name, cfg_, tensor_.size), tensor_);
  params_.push_back({name, t.to(device_, weights_).set_requires_grad(true)});
  bindings_.push_back(binds_to);
}

void Transformer::pack_parameters() {
  int64_t total = 0;
  for (const auto& p : params_) {
    SLIMPI_CHECK(p.tensor.scalar_type() == weights_, "parameter {} is not {}", p.name,
                 std::string(c10::toString(weights_)));
    total += p.tensor.numel();
  }
  flat_ = at::empty({total}, params_.front().tensor.options().requires_grad(false));
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& p : params_) {
    at::Tensor view = flat_.narrow(0, offset, p.tensor.numel()).view(p.tensor.sizes());
    view.copy_(p.tensor);
    offset += p.tensor.numel();
    p.tensor = view.detach().set_requires_grad(true);  // a leaf that shares flat_'s storage
  }
}

namespace {

void check_shards(const ModelConfig& cfg, at::ScalarType weights, const ExpertShard& experts,
                  const TensorShard& tensor) {
  SLIMPI_CHECK(tensor.size == 1 || (tensor.comm && tensor.comm->size() == tensor.size && tensor.rank >= 0 &&
                                    tensor.rank < tensor.size),
               "tensor shard {} of {} without its group", tensor.rank, tensor.size);
  check_tensor_parallel_shape(cfg, tensor.size);
  SLIMPI_CHECK(experts.size == 1 || (cfg.n_experts > 0 && cfg.n_experts % experts.size == 0 && experts.comm &&
                                     experts.rank >= 0 && experts.rank < experts.size),
               "expert shard {} of {} for a model of {} experts (the group size must divide the expert count)",
               experts.rank, experts.size, cfg.n_experts);
  SLIMPI_CHECK(weights == at::kFloat || weights == at::kBFloat16, "model weights in {}: only fp32 or bf16",
               std::string(c10::toString(weights)));
}

// The parameters drawn on the CPU from one generator, in name order; each is recorded
// through `add` with the LayerParams field it binds to. A block's attention and norms,
// its dense MLP or its experts, under prefix p (a trunk layer or an MTP depth's layer).
struct ParameterDraw {
  const ModelConfig& cfg;
  at::Generator gen;
  std::function<void(const std::string&, at::Tensor, at::Tensor*)> add;

  at::Tensor normal(std::vector<int64_t> shape) { return at::normal(0.0, cfg.init_std, shape, gen); }
  static at::Tensor ones(int64_t n) { return at::ones({n}, at::kFloat); }
  static at::Tensor zeros(int64_t n) { return at::zeros({n}, at::kFloat); }
  // An RMSNorm's weight: ones, or zeros for a zero-centred norm (applied as 1 + w).
  at::Tensor norm(int64_t n) const { return cfg.zero_centered_norm ? zeros(n) : ones(n); }

  // linear: a Gated DeltaNet layer's token mixer instead (a hybrid model's linear layers).
  void attention(const std::string& p, Transformer::LayerParams& lp, bool linear = false) {
    const int64_t d = cfg.hidden_size, hd = cfg.head_dim(), q_width = cfg.n_heads * hd, kv = cfg.n_kv_heads * hd;
    add(p + "input_layernorm.weight", norm(d), &lp.input_norm);
    if (cfg.is_mla()) {
      latent_attention(p, lp);
      return;
    }
    if (linear) {
      linear_attention(p, lp);
      return;
    }
    // (gated attention: each head's query rows, then its gate's)
    add(p + "self_attn.q_proj.weight", normal({q_width * (cfg.attn_output_gate ? 2 : 1), d}), &lp.q);
    add(p + "self_attn.k_proj.weight", normal({kv, d}), &lp.k);
    add(p + "self_attn.v_proj.weight", normal({kv, d}), &lp.v);
    if (cfg.qkv_bias) {
      add(p + "self_attn.q_proj.bias", zeros(q_width * (cfg.attn_output_gate ? 2 : 1)), &lp.q_bias);
      add(p + "self_attn.k_proj.bias", zeros(kv), &lp.k_bias);
      add(p + "self_attn.v_proj.bias", zeros(kv), &lp.v_bias);
    }
    add(p + "self_attn.o_proj.weight", normal({d, q_width}), &lp.o);
    if (cfg.o_bias) add(p + "self_attn.o_proj.bias", zeros(d), &lp.o_bias);
    if (cfg.qk_norm) {
      add(p + "self_attn.q_norm.weight", norm(hd), &lp.q_norm);
      add(p + "self_attn.k_norm.weight", norm(hd), &lp.k_norm);
    }
    add(p + "post_attention_layernorm.weight", norm(d), &lp.post_norm);
  }

  // A Gated DeltaNet layer under Qwen3.5's names. A_log = log(U(0.01, 16)) and dt_bias = 1,
  // as transformers initialises them.
  void linear_attention(const std::string& p, Transformer::LayerParams& lp) {
    const int64_t d = cfg.hidden_size, Hv = cfg.linear_num_value_heads, vd = cfg.linear_value_dim();
    const std::string a = p + "linear_attn.";
    if (cfg.linear_fused_projections) {  // Qwen3-Next's: qkv and z rows in one, b and a in another
      add(a + "in_proj_qkvz.weight", normal({cfg.linear_conv_dim() + vd, d}), &lp.lin_qkv);
      add(a + "in_proj_ba.weight", normal({2 * Hv, d}), &lp.lin_b);
    } else {
      add(a + "in_proj_qkv.weight", normal({cfg.linear_conv_dim(), d}), &lp.lin_qkv);
      add(a + "in_proj_z.weight", normal({vd, d}), &lp.lin_z);
      add(a + "in_proj_b.weight", normal({Hv, d}), &lp.lin_b);
      add(a + "in_proj_a.weight", normal({Hv, d}), &lp.lin_a);
    }
    // (held as [conv_dim, K]; the files' [conv_dim, 1, K]: io/tensor_io.h, Architecture::file_shape)
    add(a + "conv1d.weight", normal({cfg.linear_conv_dim(), cfg.linear_conv_kernel_dim}), &lp.lin_conv);
    add(a + "dt_bias", ones(Hv), &lp.lin_dt_bias);
    add(a + "A_log", at::empty({Hv}, at::kFloat).uniform_(0.01, 16.0, gen).log(), &lp.lin_a_log);
    add(a + "norm.weight", ones(cfg.linear_value_head_dim), &lp.lin_norm);
    add(a + "out_proj.weight", normal({d, vd}), &lp.lin_out);
    add(p + "post_attention_layernorm.weight", norm(d), &lp.post_norm);
  }

  // Multi-head latent attention's projections, under DeepSeek-V3's names.
  void latent_attention(const std::string& p, Transformer::LayerParams& lp) {
    const int64_t d = cfg.hidden_size, H = cfg.n_heads, r = cfg.kv_lora_rank;
    if (cfg.q_lora_rank > 0) {
      add(p + "self_attn.q_a_proj.weight", normal({cfg.q_lora_rank, d}), &lp.q_a);
      add(p + "self_attn.q_a_layernorm.weight", ones(cfg.q_lora_rank), &lp.q_a_norm);
      add(p + "self_attn.q_b_proj.weight", normal({H * cfg.head_dim(), cfg.q_lora_rank}), &lp.q);
    } else {
      add(p + "self_attn.q_proj.weight", normal({H * cfg.head_dim(), d}), &lp.q);
    }
    add(p + "self_attn.kv_a_proj_with_mqa.weight", normal({r + cfg.qk_rope_head_dim, d}), &lp.kv_a);
    add(p + "self_attn.kv_a_layernorm.weight", ones(r), &lp.kv_a_norm);
    add(p + "self_attn.kv_b_proj.weight", normal({H * (cfg.qk_nope_head_dim + cfg.v_head_dim), r}), &lp.kv_b);
    add(p + "self_attn.o_proj.weight", normal({d, H * cfg.v_head_dim}), &lp.o);
    add(p + "post_attention_layernorm.weight", ones(d), &lp.post_norm);
  }

  void dense_mlp(const std::string& p, Transformer::LayerParams& lp) {
    const int64_t d = cfg.hidden_size, f = cfg.intermediate_size;
    add(p + "mlp.gate_proj.weight", normal({f, d}), &lp.gate);
    add(p + "mlp.up_proj.weight", normal({f, d}), &lp.up);
    add(p + "mlp.down_proj.weight", normal({d, f}), &lp.down);
  }

  // Qwen3-MoE names: the router (and DeepSeekMoE's score correction bias, zeros), then
  // each expert's MLP. Every expert is drawn (the generator's sequence does not depend on
  // the shard); an expert-parallel shard keeps its own block. Qwen2-MoE's gated shared
  // expert or DeepSeekMoE's shared experts after them.
  void moe_mlp(const std::string& p, MoeWeights& moe, const ExpertShard& experts) {
    const int64_t d = cfg.hidden_size, fe = cfg.moe_intermediate_size;
    const int64_t first = experts.first(cfg.n_experts), n_mine = experts.count(cfg.n_experts);
    moe.first_expert = first;
    moe.ep = experts.size > 1 ? experts.comm : nullptr;
    moe.gate.resize(size_t(n_mine));
    moe.up.resize(size_t(n_mine));
    moe.down.resize(size_t(n_mine));
    add(p + "mlp.gate.weight", normal({cfg.n_experts, d}), &moe.router);
    if (cfg.moe_router_bias) add(p + "mlp.gate.e_score_correction_bias", zeros(cfg.n_experts), &moe.score_bias);
    for (int64_t e = 0; e < cfg.n_experts; ++e) {
      const std::string pe = p + "mlp.experts." + std::to_string(e) + ".";
      at::Tensor gate = normal({fe, d}), up = normal({fe, d}), down = normal({d, fe});
      if (e < first || e >= first + n_mine) continue;
      add(pe + "gate_proj.weight", gate, &moe.gate[size_t(e - first)]);
      add(pe + "up_proj.weight", up, &moe.up[size_t(e - first)]);
      add(pe + "down_proj.weight", down, &moe.down[size_t(e - first)]);
    }
    if (const int64_t fs = cfg.shared_expert_intermediate_size; fs > 0) {
      add(p + "mlp.shared_expert.gate_proj.weight", normal({fs, d}), &moe.shared_gate_proj);
      add(p + "mlp.shared_expert.up_proj.weight", normal({fs, d}), &moe.shared_up);
      add(p + "mlp.shared_expert.down_proj.weight", normal({d, fs}), &moe.shared_down);
      add(p + "mlp.shared_expert_gate.weight", normal({1, d}), &moe.shared_gate);
    }
    if (const int64_t fs = cfg.shared_experts_width(); fs > 0) {  // DeepSeekMoE's, ungated
      add(p + "mlp.shared_experts.gate_proj.weight", normal({fs, d}), &moe.shared_gate_proj);
      add(p + "mlp.shared_experts.up_proj.weight", normal({fs, d}), &moe.shared_up);
      add(p + "mlp.shared_experts.down_proj.weight", normal({d, fs}), &moe.shared_down);
    }
  }
};

// RoPE tables [S, R] (R = the rotary dimensions): angle(pos, i) = pos * f_i (f_i =
// theta^(-2i/R), scaled as the config says), duplicated over both halves; cos and sin.
std::pair<at::Tensor, at::Tensor> rope_tables(const ModelConfig& cfg, const at::Device& device) {
  at::Tensor inv_freq = at::tensor(cfg.rope_inv_freq(), at::kDouble);                 // [D/2]
  at::Tensor angles = at::outer(at::arange(cfg.max_seq_len, at::kDouble), inv_freq);  // [S, D/2]
  at::Tensor full = at::cat({angles, angles}, -1);                                     // [S, D]
  const double factor = cfg.rope_cos_sin_factor();                                     // YaRN's attention factor
  return {(full.cos() * factor).to(at::kFloat).to(device), (full.sin() * factor).to(at::kFloat).to(device)};
}

}  // namespace

Transformer::Transformer(const ModelConfig& cfg, uint64_t seed, const at::Device& device, at::ScalarType weights,
                         const ExpertShard& experts, const TensorShard& tensor, const ContextShard& context,
                         const PipelineShard& pipeline)
    : cfg_(cfg),
      device_(device),
      weights_(weights),
      experts_(experts),
      tensor_(tensor),
      context_(context),
      pipeline_(pipeline) {
  check_shards(cfg, weights, experts, tensor);
  // (the embedding's copies: the first and last stages sum their gradients over `tied`)
  const bool holds_tied_copy = last_stage_copies_embedding(cfg) && (pipeline.first() || pipeline.last());
  SLIMPI_CHECK(pipeline.size == 1 || (pipeline.comm && pipeline.comm->size() == pipeline.size &&
                                      (!holds_tied_copy || pipeline.tied) && pipeline.first_layer < pipeline.end_layer),
               "pipeline stage {} of {} (layers {}..{}) without its groups", pipeline.stage, pipeline.size,
               pipeline.first_layer, pipeline.end_layer - 1);
  SLIMPI_CHECK(context.size == 1 || (context.comm && context.comm->size() == context.size && context.rank >= 0 &&
                                     context.rank < context.size),
               "context shard {} of {} without its group", context.rank, context.size);
  const int64_t columns = padded_vocab_size(cfg.vocab_size, tensor.size) / tensor.size;
  vocab_begin_ = columns * tensor.rank;
  n_real_vocab_ = std::clamp<int64_t>(cfg.vocab_size - vocab_begin_, 0, columns);
  // Each name is spelled once: add() records where the parameter binds (a LayerParams
  // field), and the loop after pack_parameters() points there once the storage is final.
  ParameterDraw draw{cfg, at::detail::createCPUGenerator(seed),
                     [this](const std::string& name, at::Tensor t, at::Tensor* binds_to) { add(name, t, binds_to); }};
  const int64_t d = cfg.hidden_size;
  layers_.resize(size_t(cfg.n_layers));  // stable addresses for the bindings
  add("model.embed_tokens.weight", draw.normal({cfg.vocab_size, d}), &embed_);
  for (int64_t l = 0, linear = 0; l < cfg.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerParams& lp = layers_[size_t(l)];
    if (cfg.is_linear_layer(l)) lp.linear_index = linear++;
    draw.attention(p, lp, cfg.is_linear_layer(l));
    if (cfg.is_moe_layer(l)) draw.moe_mlp(p, lp.moe, experts);
    else draw.dense_mlp(p, lp);
  }
  add("model.norm.weight", draw.norm(d), &final_norm_);
  if (!cfg.tie_word_embeddings) add("lm_head.weight", draw.normal({cfg.vocab_size, d}), &lm_head_);
  // MTP depths last, so that the trunk draws the same numbers with or without them.
  mtp_.resize(size_t(cfg.mtp_num_layers));
  for (int64_t i = 0; i < cfg.mtp_num_layers; ++i) {
    const std::string p = "model.mtp_layers." + std::to_string(i) + ".";
    MtpParams& m = mtp_[size_t(i)];
    add(p + "token_layernorm.weight", draw.norm(d), &m.token_norm);
    add(p + "hidden_layernorm.weight", draw.norm(d), &m.hidden_norm);
    add(p + "input_proj.weight", draw.normal({d, 2 * d}), &m.input_proj);
    draw.attention(p, m.block);
    if (cfg.mtp_is_moe()) draw.moe_mlp(p, m.block.moe, experts);
    else draw.dense_mlp(p, m.block);
    add(p + "final_layernorm.weight", draw.norm(d), &m.final_norm);
  }
  pack_parameters();
  for (size_t i = 0; i < params_.size(); ++i) *bindings_[i] = params_[i].tensor;
  bindings_.clear();  // (pointers into this object: not kept past construction)
  if (cfg.tie_word_embeddings) lm_head_ = embed_;
  std::tie(rope_cos_, rope_sin_) = rope_tables(cfg, device_);
  routing_ = {cfg.n_experts_per_tok, cfg.norm_topk_prob, cfg.moe_router == "sigmoid", cfg.moe_n_group,
              cfg.moe_topk_group, cfg.moe_routed_scaling_factor};
}

void Transformer::copy_weights_from(const Transformer& other) {
  SLIMPI_CHECK(other.flat_.numel() == flat_.numel() && other.params_.size() == params_.size(),
               "copy_weights_from: models of {} and {} parameters", other.flat_.numel(), flat_.numel());
  at::NoGradGuard no_grad;
  flat_.copy_(other.flat_);  // one pass: the layouts are the same, element for element
}

void Transformer::copy_shard_from(const Transformer& whole) {
  SLIMPI_CHECK(!whole.sharded() && experts_.size == 1 && whole.params_.size() == params_.size(),
               "copy_shard_from: a whole model of {} tensors into a tensor shard of {}", whole.params_.size(),
               params_.size());
  at::NoGradGuard no_grad;
  const StoredWhole stored{&cfg_, tensor_};
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].tensor.copy_(stored.part_of(params_[i].name, whole.params_[i].tensor));
}

bool Transformer::is_expert_parameter(const std::string& name) {
  return name.find(".mlp.experts.") != std::string::npos;
}

at::Tensor& Transformer::parameter(const std::string& name) {
  for (auto& p : params_)
    if (p.name == name) return p.tensor;
  SLIMPI_FAIL("model has no parameter '{}'", name);
}

int64_t Transformer::n_params() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.tensor.numel();
  return n;
}


at::Tensor Transformer::attention_block(const LayerParams& p, int64_t cache_layer, const at::Tensor& x,
                                        const ForwardContext& f) const {
  if (cfg_.is_mla()) return latent_attention_block(p, cache_layer, x, f);
  if (p.linear_index >= 0) return linear_attention_block(p, x, f);
  // Tensor parallelism: this shard's H/t query heads and Hkv/t key/value heads (column-
  // parallel q/k/v, row-parallel o; the sum over shards is reduce_from_tp). Each head's
  // q/k norm weight is shared by every shard's heads: copy_to_tp sums its gradient.
  // With t > Hkv a shard holds the one key/value head its query heads attend with, as do
  // the other replicas of that head; each replica's k/v gradient is the part its own
  // query heads give, so copy_to_tp over the replicas sums them.
  Comm* tp = f.tp;
  const int64_t T = f.n_tokens, H = cfg_.n_heads / tensor_.size, Hkv = local_kv_heads(cfg_, tensor_.size),
                D = cfg_.head_dim();
  const at::Tensor h = f.to_columns(rms_norm(x, f.norm_weight(f.shared(p.input_norm)), cfg_.rms_norm_eps));  // [T, d]
  auto kv_weight = [&](const at::Tensor& w) { return w.defined() ? f.kv_shared(w) : w; };
  at::Tensor q = dense(h, p.q, p.q_bias);  // [T, H * D] ([T, H * 2D] gated: each head's query, then its gate)
  at::Tensor gate;                         // [T, H * D] (gated attention)
  if (cfg_.attn_output_gate) {
    const at::Tensor both = q.view({T, H, 2 * D});
    gate = both.narrow(-1, D, D).reshape({T, H * D});
    q = both.narrow(-1, 0, D);
  }
  q = q.reshape({T, H, D});  // [T, H, D]
  at::Tensor k = dense(h, kv_weight(p.k), kv_weight(p.k_bias)).view({T, Hkv, D});  // [T, Hkv, D]
  if (cfg_.qk_norm) {  // Qwen3: each head RMS-normalised before RoPE
    q = rms_norm(q, f.norm_weight(copy_to_tp(tp, p.q_norm)), cfg_.rms_norm_eps);
    k = rms_norm(k, f.norm_weight(copy_to_tp(tp, p.k_norm)), cfg_.rms_norm_eps);
  }
  q = apply_rope(q, f.cos, f.sin);
  k = apply_rope(k, f.cos, f.sin);
  const at::Tensor v = dense(h, kv_weight(p.v), kv_weight(p.v_bias)).view({T, Hkv, D});  // [T, Hkv, D]
  const at::Tensor attn = attend_heads(q, k, v, cache_layer, f);                          // [T, H * D]
  return output_projection(p, gate.defined() ? attn * sigmoid_of(gate) : attn, f);
}

at::Tensor Transformer::attend_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     int64_t cache_layer, const ForwardContext& f) const {
  // Selective recomputation: the attention's inner products (scores, softmax) run again in backward.
  if (f.recompute == Recompute::Selective)
    return recomputed([layout = f.kept_layout, plan = f.plan, cache_layer](const std::vector<at::Tensor>& in) {
             return std::vector<at::Tensor>{attend(in[0], in[1], in[2], *layout, nullptr, cache_layer, plan)};
           }, {q, k, v})[0];
  return attend(q, k, v, f.layout, f.cache, cache_layer, f.plan);  // [T, H * D]
}

at::Tensor Transformer::output_projection(const LayerParams& p, const at::Tensor& attn, const ForwardContext& f) const {
  if (!f.tp) return dense(attn, p.o, p.o_bias);          // [T, d]
  const at::Tensor out = f.from_rows(dense(attn, p.o));  // [T_local, d]
  if (!p.o_bias.defined()) return out;
  // Exact numerics: the bias as used (a bf16 forward's rounding, what a bf16 engine holds),
  // so that trainer and engine add the same bits.
  return out + (exact_numerics() ? f.as_used(f.shared(p.o_bias)) : f.shared(p.o_bias));
}

at::Tensor Transformer::dense_mlp_residual(const LayerParams& p, const at::Tensor& x, const ForwardContext& f) const {
  // SwiGLU; tensor-parallel: column-parallel gate/up, row-parallel down.
  const at::Tensor hp = f.to_columns(rms_norm(x, f.norm_weight(f.shared(p.post_norm)), cfg_.rms_norm_eps));
  return x + f.from_rows(dense(swiglu(dense(hp, p.gate), dense(hp, p.up)), p.down));
}

at::Tensor Transformer::moe_residual(const MoeWeights& w, const at::Tensor& routed, const at::Tensor& h,
                                     const ForwardContext& f) const {
  const at::Tensor out = f.own_rows(routed);
  if (!w.shared_up.defined()) return out;
  const at::Tensor shared = f.from_rows(shared_experts_mlp(f.to_columns(h), w));  // [T_own, d]
  return out + (w.shared_gate.defined() ? sigmoid_of(dense(h, f.shared(w.shared_gate))) * shared : shared);
}

at::Tensor Transformer::embed(const at::Tensor& tokens, const ForwardContext& f, const at::Tensor& weight) const {
  if (tensor_.size == 1) return at::embedding(f.as_used(weight), tokens).to(at::kFloat);  // [T, d]
  // Vocab-parallel: this shard's rows look up their tokens, every other token is zero
  // here; the sum over shards is each token's row.
  const at::Tensor local = tokens - vocab_begin_;
  const at::Tensor elsewhere = local.lt(0).logical_or(local.ge(weight.size(0)));  // [T]
  const at::Tensor rows = at::embedding(f.as_used(weight), local.masked_fill(elsewhere, 0)).to(at::kFloat);
  return f.from_rows(rows.masked_fill(elsewhere.unsqueeze(1), 0.0));  // [T_local, d]
}

Transformer::ForwardContext Transformer::context(const AttentionLayout& a, KvCache* cache, int64_t T,
                                                 bool sequence_parallel) const {
  ForwardContext f{a, cache, {}, {}, {}};
  f.tp = tensor_.size > 1 ? tensor_.comm : nullptr;
  f.sp = f.tp && sequence_parallel;
  if (f.tp && kv_head_replicas(cfg_, tensor_.size) > 1 && at::GradMode::is_enabled()) {
    SLIMPI_CHECK(tensor_.kv_replicas, "tensor parallelism over {} ranks replicates the {} key/value heads: a forward "
                 "with gradients needs the replicas' communicator (TensorShard::kv_replicas)", tensor_.size,
                 cfg_.n_kv_heads);
    f.kv_replicas = tensor_.kv_replicas;
  }
  f.n_tokens = T;
  f.n_padded = f.sp ? (T + tensor_.size - 1) / tensor_.size * tensor_.size : T;
  f.bf16 = at::autocast::is_autocast_enabled(device_.type()) &&
           at::autocast::get_autocast_dtype(device_.type()) == at::kBFloat16;
  f.zero_centered = cfg_.zero_centered_norm;
  // Auto: the paged kernel for an fp32 forward on the CPU. A bf16 forward gathers and
  // runs the same attention ops as the bf16 trainer (padded batches below the budget,
  // per-sequence SDPA above it), so where both take the same path a bf16 engine samples
  // with the log-probs a bf16 trainer recomputes (the kernel accumulates in fp32 and
  // would differ at bf16 rounding everywhere).
  f.plan.padded_budget = padded_attention_budget_;
  f.plan.decode = decode_attention_ != DecodeAttention::Auto ? decode_attention_
                  : device_.is_cpu() && !f.bf16              ? DecodeAttention::Paged
                                                             : DecodeAttention::Gather;
  f.cos = rope_cos_.index_select(0, a.positions).unsqueeze(1);  // [T, 1, D]
  f.sin = rope_sin_.index_select(0, a.positions).unsqueeze(1);  // [T, 1, D]
  return f;
}

at::Tensor Transformer::forward(const at::Tensor& tokens, const AttentionLayout& a, KvCache* cache, MoeTrace* moe,
                                bool to_logits, at::Tensor* hidden, const at::Tensor& logit_rows) const {
  const int64_t T = a.positions.size(0);
  if (moe) {
    moe->router_logits.clear();
    moe->chosen = at::Tensor();
    moe->routed = at::Tensor();
    SLIMPI_CHECK(!moe->replay.defined() || (moe->replay.dim() == 3 && moe->replay.size(0) == T &&
                                            moe->replay.size(1) == cfg_.n_moe_layers()),
                 "routing replay: expert ids for {} tokens and {} MoE layers expected", T, cfg_.n_moe_layers());
  }
  // Activation recomputation (training forwards only): the blocks run again in backward
  // from a copy of this forward's context, whose layout must outlive the forward.
  const bool recompute = recompute_ != Recompute::None && !cache && at::GradMode::is_enabled();
  const auto kept_layout = recompute ? std::make_shared<const AttentionLayout>(a) : nullptr;
  ForwardContext f = context(kept_layout ? *kept_layout : a, cache, T, tensor_.sequence_parallel);
  f.recompute = recompute ? recompute_ : Recompute::None;
  f.kept_layout = kept_layout;
  std::vector<at::Tensor> chosen, own;  // per MoE layer [T, k]: experts run, the router's own top-k
  const size_t first_layer = size_t(pipeline_.first_layer);
  const size_t end_layer = pipeline_.end_layer < 0 ? layers_.size() : size_t(pipeline_.end_layer);
  int64_t moe_layer = 0;  // the model's index of the next MoE layer (a later stage's first is past the earlier ones)
  for (size_t l = 0; l < first_layer; ++l) moe_layer += cfg_.is_moe_layer(int64_t(l));
  // [T, d] ([T_local, d] sequence-parallel): the residual stream is fp32 (a later pipeline stage's input)
  at::Tensor x = pipeline_.first() ? embed(tokens, f, embed_) : tokens;
  // Full recomputation's blocks run from a copy of the context (which holds kept_layout).
  const auto kept = f.recompute == Recompute::Full ? std::make_shared<const ForwardContext>(f) : nullptr;
  for (size_t l = first_layer; l < end_layer; ++l) {
    const LayerParams& p = layers_[l];
    const bool dense = !cfg_.is_moe_layer(int64_t(l));
    if (kept) {  // full recomputation: the attention block, and a dense layer's MLP with it
      x = recomputed([this, l, dense, kept](const std::vector<at::Tensor>& in) {
            const LayerParams& layer = layers_[l];
            at::Tensor y = in[0] + attention_block(layer, int64_t(l), in[0], *kept);
            return std::vector<at::Tensor>{dense ? dense_mlp_residual(layer, y, *kept) : y};
          }, {x})[0];
      if (dense) continue;
    } else {
      x = x + attention_block(p, int64_t(l), x, f);
      if (dense) {
        x = dense_mlp_residual(p, x, f);
        continue;
      }
    }
    const at::Tensor h = rms_norm(x, f.norm_weight(f.shared(p.post_norm)), cfg_.rms_norm_eps);
    const at::Tensor replay = moe && moe->replay.defined() ? moe->replay.select(1, moe_layer) : at::Tensor();
    MoeLayerOutput routed = moe_mlp(f.whole_rows(h), p.moe, routing_, replay);
    x = x + moe_residual(p.moe, routed.out, h, f);
    if (moe) {
      chosen.push_back(routed.chosen);
      own.push_back(routed.routed);
      moe->router_logits.push_back(routed.router_logits);
    }
    ++moe_layer;
  }
  if (moe && !chosen.empty()) {
    moe->chosen = at::stack(chosen, 1);  // [T, n_moe_layers, k]
    moe->routed = at::stack(own, 1);
  }
  if (!pipeline_.last()) return x;  // [T_local, d] the residual stream, to the next stage
  x = f.to_columns(rms_norm(x, f.norm_weight(f.shared(final_norm_)), cfg_.rms_norm_eps));
  if (hidden) *hidden = x.to(at::kFloat);         // [T, d]
  if (!to_logits) return x.to(at::kFloat);        // [T, d]
  if (logit_rows.defined()) x = x.index_select(0, logit_rows.to(x.device()));  // [R, d]
  return dense(x, lm_head_).to(at::kFloat);  // [T, V] or [R, V] (this shard's [., Vp / t])
}

// Depth i of the MTP stack (DeepSeek-V3's module k = i + 1):
//   h_i = final_norm_i(Layer_i(input_proj_i([hidden_norm_i(h_{i-1}) ; token_norm_i(E(x_next))])))
// with Layer_i a transformer layer over the same positions (its own KV cache layer,
// n_layers + i; full attention in a hybrid model; dense, or an MoE layer in a DeepSeekMoE
// model or a hybrid MoE one: ModelConfig::mtp_is_moe),
// E the trunk's embedding read detached (an MTP loss trains the MTP layers only) and the
// concatenation in MiMo's order (hidden first). Never sequence-parallel (every rank holds
// every token's row), never recomputed.
at::Tensor Transformer::mtp_depth(int64_t depth, const at::Tensor& in, const at::Tensor& next,
                                  const AttentionLayout& a, KvCache* cache) const {
  SLIMPI_CHECK(depth >= 0 && depth < int64_t(mtp_.size()), "MTP depth {} of a model with {}", depth, mtp_.size());
  const int64_t T = next.size(0);
  SLIMPI_CHECK(in.dim() == 2 && in.size(0) == T && in.size(1) == cfg_.hidden_size,
               "MTP depth {}: {} input rows for {} tokens", depth, in.size(0), T);
  const MtpParams& m = mtp_[size_t(depth)];
  const ForwardContext f = context(a, cache, T, /*sequence_parallel=*/false);
  const at::Tensor e = embed(next, f, embed_.detach());  // [T, d]
  const at::Tensor joined = at::cat({rms_norm(in.to(at::kFloat), f.norm_weight(m.hidden_norm), cfg_.rms_norm_eps),
                                     rms_norm(e, f.norm_weight(m.token_norm), cfg_.rms_norm_eps)},
                                    -1);                                       // [T, 2d]
  at::Tensor x = dense(joined, m.input_proj).to(at::kFloat);            // [T, d]
  x = x + attention_block(m.block, cfg_.n_layers + depth, x, f);
  if (cfg_.mtp_is_moe()) {  // routed by its own router, never traced or replayed
    const at::Tensor h = rms_norm(x, f.norm_weight(m.block.post_norm), cfg_.rms_norm_eps);
    x = x + moe_residual(m.block.moe, moe_mlp(h, m.block.moe, routing_).out, h, f);
  } else {
    x = dense_mlp_residual(m.block, x, f);
  }
  return rms_norm(x, f.norm_weight(m.final_norm), cfg_.rms_norm_eps).to(at::kFloat);  // [T, d]
}

at::Tensor Transformer::forward_mtp_packed(int64_t depth, const at::Tensor& in, const at::Tensor& next,
                                           const std::vector<int64_t>& seq_lens) const {
  check_packed(next, seq_lens);
  if (const auto split = context_split(seq_lens))
    return mtp_depth(depth, in, next.index_select(0, split->local_rows()), context_layout(split, device_), nullptr);
  return mtp_depth(depth, in, next, packed_layout(seq_lens, device_), nullptr);
}

at::Tensor Transformer::forward_mtp_incremental(int64_t depth, const at::Tensor& in, const at::Tensor& next,
                                                const std::vector<CachedSequence>& seqs, KvCache& cache) const {
  SLIMPI_CHECK(int64_t(cache.k.size()) > cfg_.n_layers + depth, "MTP depth {}: the KV cache has {} layers (the "
               "model's {} and {} MTP layers needed)", depth, cache.k.size(), cfg_.n_layers, depth + 1);
  const SmallBatchLinearScope decode_rows;  // the few rows of a decode step (kernels/small_batch_linear.h)
  return mtp_depth(depth, in, next, incremental_layout(seqs, split_decode_and_prefill_, device_), &cache);
}

at::Tensor Transformer::head_logits(const at::Tensor& hidden) const {
  return dense(hidden.to(lm_head_.scalar_type()), lm_head_.detach()).to(at::kFloat);  // [T, V] (shard: [T, Vp / t])
}

void Transformer::check_packed(const at::Tensor& tokens, const std::vector<int64_t>& seq_lens) const {
  int64_t total = 0;
  for (int64_t n : seq_lens) {
    SLIMPI_CHECK(n > 0 && n <= cfg_.max_seq_len, "sequence of {} tokens (model.max_seq_len = {})", n,
                 cfg_.max_seq_len);
    total += n;
  }
  SLIMPI_CHECK(total == tokens.size(0), "forward_packed: {} tokens but lengths sum to {}", tokens.size(0), total);
}

std::shared_ptr<const ContextSplit> Transformer::context_split(const std::vector<int64_t>& seq_lens) const {
  if (context_.size == 1) return nullptr;
  return std::make_shared<const ContextSplit>(context_, seq_lens, device_);
}

at::Tensor Transformer::forward_split(const at::Tensor& local_input, const std::shared_ptr<const ContextSplit>& split,
                                      MoeTrace* moe, bool to_logits) const {
  const at::Tensor& mine = split->local_rows();  // [T_i]
  at::Tensor replay;                             // [T, n_moe_layers, k] the caller's, restored after
  if (moe && moe->replay.defined()) {
    SLIMPI_CHECK(moe->replay.dim() == 3 && moe->replay.size(0) == split->n_tokens(),
                 "routing replay: expert ids for {} tokens expected", split->n_tokens());
    replay = moe->replay;
    moe->replay = replay.index_select(0, mine);
  }
  const at::Tensor out = forward(local_input, context_layout(split, device_), nullptr, moe, to_logits);
  if (moe) {
    moe->replay = replay;
    const ContextSplit::Items& every = split->all_rows();
    if (moe->chosen.defined()) {
      moe->chosen = split->gather_items(every, moe->chosen);  // [T, n_moe_layers, k]
      moe->routed = split->gather_items(every, moe->routed);
    }
    for (auto& logits : moe->router_logits) logits = split->gather_items(every, logits);  // [T, E]
  }
  return out;  // [T_i, .]
}

at::Tensor Transformer::forward_packed_stage(const at::Tensor& input, const std::vector<int64_t>& seq_lens,
                                            MoeTrace* moe) const {
  if (pipeline_.first()) check_packed(input, seq_lens);
  SLIMPI_CHECK(pipeline_.first() || (input.dim() == 2 && input.size(0) == stage_rows(seq_lens)),
               "pipeline stage {}: an input of [{}] for {} rows of the residual stream", pipeline_.stage,
               fmt::join(input.sizes(), ", "), stage_rows(seq_lens));
  if (const auto split = context_split(seq_lens))
    return forward_split(pipeline_.first() ? input.index_select(0, split->local_rows()) : input, split, moe,
                         /*to_logits=*/false);
  return forward(input, packed_layout(seq_lens, device_), nullptr, moe, /*to_logits=*/false);
}

int64_t Transformer::stage_rows(const std::vector<int64_t>& seq_lens) const {
  int64_t T = 0;
  for (int64_t n : seq_lens) T += n;
  if (const auto split = context_split(seq_lens)) T = split->n_local();
  if (tensor_.size > 1 && tensor_.sequence_parallel) T = (T + tensor_.size - 1) / tensor_.size;
  return T;
}

at::Tensor Transformer::forward_packed(const at::Tensor& tokens, const std::vector<int64_t>& seq_lens,
                                      MoeTrace* moe) const {
  SLIMPI_CHECK(pipeline_.size == 1, "pipeline stage {} of {}: a packed forward runs stage by stage "
               "(forward_packed_stage)", pipeline_.stage, pipeline_.size);
  check_packed(tokens, seq_lens);
  if (const auto split = context_split(seq_lens))
    return forward_split(tokens.index_select(0, split->local_rows()), split, moe, /*to_logits=*/true);
  return forward(tokens, packed_layout(seq_lens, device_), nullptr, moe);
}

at::Tensor Transformer::forward_packed_hidden(const at::Tensor& tokens, const std::vector<int64_t>& seq_lens,
                                             MoeTrace* moe) const {
  SLIMPI_CHECK(pipeline_.size == 1, "pipeline stage {} of {}: a packed forward runs stage by stage "
               "(forward_packed_stage)", pipeline_.stage, pipeline_.size);
  check_packed(tokens, seq_lens);
  if (const auto split = context_split(seq_lens))
    return forward_split(tokens.index_select(0, split->local_rows()), split, moe, /*to_logits=*/false);
  return forward(tokens, packed_layout(seq_lens, device_), nullptr, moe, /*to_logits=*/false);
}

at::Tensor Transformer::forward_incremental(const at::Tensor& tokens, const std::vector<CachedSequence>& seqs,
                                            KvCache& cache, MoeTrace* moe, at::Tensor* hidden,
                                            bool to_logits, const at::Tensor& logit_rows) const {
  for (const auto& s : seqs) {
    SLIMPI_CHECK(s.n_new > 0 && s.n_past + s.n_new <= cfg_.max_seq_len,
                 "cached sequence of {} + {} tokens (model.max_seq_len = {})", s.n_past, s.n_new, cfg_.max_seq_len);
    SLIMPI_CHECK(s.slots.numel() == s.n_past + s.n_new, "sequence has {} slots for {} positions", s.slots.numel(),
                 s.n_past + s.n_new);
  }
  // Decode sequences and prefill chunks in one batch attend apart (AttentionLayout::parts).
  const SmallBatchLinearScope decode_rows;  // the few rows of a decode step (kernels/small_batch_linear.h)
  return forward(tokens, incremental_layout(seqs, split_decode_and_prefill_, device_), &cache, moe, to_logits, hidden,
                 logit_rows);
}

}  // namespace slimpi
