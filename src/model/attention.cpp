#include "model/attention.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "kernels/batch_invariant.h"
#include "kernels/paged_attention.h"
#include "model/context_split.h"
#include "model/recompute.h"
#include "model/kv_cache.h"

namespace slimpi {
namespace {

// Scatter the [T_l, heads, D] rows of layout l's tokens into a zero-padded
// [B_l, Lq_l, heads, D] batch.
at::Tensor pad(const at::Tensor& x, const AttentionLayout& l) {
  return at::zeros({l.n_seqs, l.max_new, x.size(1), x.size(2)}, x.options()).index_put({l.b_of_t, l.j_of_t}, x);
}

// Causal attention of B packed sequences without padding, each alone.
// q [T, H, D], k/v [T, Hkv, D], sequences back to back with lengths seq_lens -> [T, H, D].
at::Tensor attend_unpadded(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::vector<int64_t>& seq_lens) {
  std::vector<at::Tensor> out;
  int64_t start = 0;
  for (int64_t L : seq_lens) {
    out.push_back(attend_one_sequence(q.narrow(0, start, L), k.narrow(0, start, L), v.narrow(0, start, L), 0));
    start += L;
  }
  return at::cat(out);
}

// The layout of B sequences with n_past[b] cached and n_new[b] new tokens.
// slots: the cache slots of every position of each sequence (empty: packed, no cache).
AttentionLayout make_layout(const std::vector<int64_t>& n_past, const std::vector<int64_t>& n_new,
                            const std::vector<at::Tensor>& slots, const at::Device& device) {
  AttentionLayout a;
  a.n_seqs = static_cast<int64_t>(n_new.size());
  a.n_past_host = n_past;
  a.n_new_host = n_new;
  std::vector<int64_t> b_of_t, j_of_t, pos, n_keys;
  for (int64_t b = 0; b < a.n_seqs; ++b) {
    a.max_new = std::max(a.max_new, n_new[b]);
    a.max_keys = std::max(a.max_keys, n_past[b] + n_new[b]);
    n_keys.push_back(n_past[b] + n_new[b]);
    for (int64_t j = 0; j < n_new[b]; ++j) {
      b_of_t.push_back(b);
      j_of_t.push_back(j);
      pos.push_back(n_past[b] + j);
    }
  }
  const auto opts = at::TensorOptions().dtype(at::kLong);
  a.b_of_t = at::tensor(b_of_t, opts).to(device);
  a.j_of_t = at::tensor(j_of_t, opts).to(device);
  a.positions = at::tensor(pos, opts).to(device);
  a.n_keys = at::tensor(n_keys, opts).to(device);
  at::Tensor past = at::tensor(n_past, opts).view({a.n_seqs, 1});
  a.q_pos = (past + at::arange(a.max_new, opts).view({1, a.max_new})).to(device);
  if (!slots.empty()) {
    std::vector<at::Tensor> fresh, padded;
    for (int64_t b = 0; b < a.n_seqs; ++b) {
      at::Tensor s = slots[b].to(at::kCPU);
      fresh.push_back(s.narrow(0, n_past[b], n_new[b]));
      padded.push_back(at::constant_pad_nd(s, {0, a.max_keys - s.size(0)}, 0));
    }
    a.new_slots = at::cat(fresh).to(device);
    a.key_slots = at::cat(padded).to(device);
  }
  return a;
}

// Keys and values of `slots` of layer `layer`, gathered into the cache's reused buffer:
// K, V [n, Hkv, D] in the compute dtype `dtype` (one tensor twice for a latent cache,
// whose values are its keys).
std::pair<at::Tensor, at::Tensor> gather_cached(KvCache& cache, int64_t layer, const at::Tensor& slots,
                                                at::ScalarType dtype) {
  const int64_t rows = slots.size(0), Hkv = cache.k[layer].size(1), D = cache.k[layer].size(2);
  if (!cache.gathered_k.defined() || cache.gathered_k.size(0) < rows) {  // grow, never shrink
    cache.gathered_k = at::empty({rows, Hkv, D}, cache.k[layer].options());
    if (!cache.values_are_keys) cache.gathered_v = at::empty({rows, Hkv, D}, cache.v[layer].options());
  }
  at::Tensor kg = cache.gathered_k.narrow(0, 0, rows);
  cache.select(layer, true, slots, kg);
  const at::Tensor k = cache.decoded(kg, layer, true, dtype);
  if (cache.values_are_keys) return {k, k};
  at::Tensor vg = cache.gathered_v.narrow(0, 0, rows);
  cache.select(layer, false, slots, vg);
  return {k, cache.decoded(vg, layer, false, dtype)};
}

// Queries of `part` against their sequences' cached keys (padded within the part,
// except for the paged kernel, which reads one query row per sequence) -> [T_part, H, D].
at::Tensor attend_cached(const AttentionLayout& part, const at::Tensor& q_part, KvCache& cache, int64_t layer,
                         at::ScalarType dtype, const AttentionPlan& plan) {
  const int64_t Bp = part.n_seqs, Lkp = part.max_keys, H = q_part.size(1);
  const int64_t Hkv = cache.k[layer].size(1), D = cache.k[layer].size(2);
  if (part.max_new == 1 && plan.decode == DecodeAttention::Paged)  // decode rows: q_part row b is sequence b
    return paged_decode_attention(q_part, cache.k[layer], cache.v[layer], part.key_slots.view({Bp, Lkp}), part.n_keys,
                                  cache.quantized() ? cache.k_scale[layer] : at::Tensor(),
                                  cache.quantized() ? cache.v_scale[layer] : at::Tensor());
  // Long prefill chunks: each sequence alone through SDPA, no [B, H, Lq, Lk] scores.
  if (part.max_new > 1 && plan.decode != DecodeAttention::FreshGather &&
      Bp * H * part.max_new * Lkp > plan.padded_budget) {
    std::vector<at::Tensor> outs;
    for (int64_t b = 0, row = 0; b < Bp; row += part.n_new_host[b], ++b) {
      const int64_t n_past = part.n_past_host[b], n_new = part.n_new_host[b];
      auto [kb, vb] = gather_cached(cache, layer, part.key_slots.narrow(0, b * Lkp, n_past + n_new), dtype);
      outs.push_back(attend_one_sequence(q_part.narrow(0, row, n_new), kb, vb, n_past));
    }
    return at::cat(outs);
  }
  at::Tensor kp, vp;  // [Bp, Lkp, Hkv, D]
  if (plan.decode == DecodeAttention::FreshGather) {
    kp = cache.decoded(cache.select(layer, true, part.key_slots), layer, true, dtype);
    vp = cache.values_are_keys ? kp : cache.decoded(cache.select(layer, false, part.key_slots), layer, false, dtype);
  } else {
    std::tie(kp, vp) = gather_cached(cache, layer, part.key_slots, dtype);
  }
  kp = kp.view({Bp, Lkp, Hkv, D}).to(dtype);
  vp = vp.view({Bp, Lkp, Hkv, D}).to(dtype);
  return attend_padded(pad(q_part, part), kp, vp, part.q_pos, part.n_keys).index({part.b_of_t, part.j_of_t});
}

}  // namespace

AttentionLayout packed_layout(const std::vector<int64_t>& seq_lens, const at::Device& device) {
  AttentionLayout layout = make_layout(std::vector<int64_t>(seq_lens.size(), 0), seq_lens, {}, device);
  layout.seq_lens = seq_lens;
  return layout;
}

AttentionLayout context_layout(std::shared_ptr<const ContextSplit> split, const at::Device& device) {
  std::vector<int64_t> first, n_new, key_rows;
  int64_t max_keys = 0;
  for (const auto& ch : split->chunks()) max_keys = std::max(max_keys, ch.end);
  for (const auto& ch : split->chunks()) {
    first.push_back(ch.begin);
    n_new.push_back(ch.end - ch.begin);
    for (int64_t j = 0; j < max_keys; ++j) key_rows.push_back(j < ch.end ? ch.seq_start + j : 0);
  }
  AttentionLayout layout = make_layout(first, n_new, {}, device);
  layout.key_rows = at::tensor(key_rows, at::kLong).to(device);
  layout.context = std::move(split);
  return layout;
}

AttentionLayout incremental_layout(const std::vector<CachedSequence>& seqs, bool split_decode_and_prefill,
                                   const at::Device& device) {
  std::vector<int64_t> n_past, n_new, state_slots;
  std::vector<at::Tensor> slots;
  for (const auto& s : seqs) {
    n_past.push_back(s.n_past);
    n_new.push_back(s.n_new);
    slots.push_back(s.slots);
    state_slots.push_back(s.state_slot);
  }
  AttentionLayout layout = make_layout(n_past, n_new, slots, device);
  layout.state_slots = state_slots;
  const bool decodes = std::any_of(n_new.begin(), n_new.end(), [](int64_t n) { return n == 1; });
  const bool prefills = std::any_of(n_new.begin(), n_new.end(), [](int64_t n) { return n > 1; });
  if (!decodes || !prefills || !split_decode_and_prefill) return layout;
  for (bool decode : {true, false}) {
    std::vector<int64_t> past, fresh, rows, part_states;
    std::vector<at::Tensor> part_slots;
    int64_t row = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if ((n_new[i] == 1) == decode) {
        part_states.push_back(state_slots[i]);
        past.push_back(n_past[i]);
        fresh.push_back(n_new[i]);
        part_slots.push_back(slots[i]);
        for (int64_t j = 0; j < n_new[i]; ++j) rows.push_back(row + j);
      }
      row += n_new[i];
    }
    AttentionLayout::Part part;
    part.layout = make_layout(past, fresh, part_slots, device);
    part.layout.state_slots = part_states;
    part.token_index = at::tensor(rows, at::kLong).to(device);
    layout.parts.push_back(std::move(part));
  }
  return layout;
}

namespace {

// Packed sequences without a cache through ATen: padded below the budget, each sequence
// alone above it -> [T, H * D].
at::Tensor attend_packed(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionLayout& a,
                         const AttentionPlan& plan) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  if (a.n_seqs * H * a.max_new * a.max_keys > plan.padded_budget)
    return attend_unpadded(q, k, v, a.seq_lens).reshape({T, H * D});
  return attend_padded(pad(q, a), pad(k, a), pad(v, a), a.q_pos, a.n_keys)  // [B, Lq, H, D]
      .index({a.b_of_t, a.j_of_t})                                           // [T, H, D]
      .reshape({T, H * D});
}

// One chunk's causal attention to its sequence's keys without a mask (CPU): queries q
// [1, H, Lq, D] at positions n_past.. against keys/values [1, Hkv, n_past + Lq, D] as two
// flash attentions, the past keys whole and the chunk's own keys causal, merged by their
// log-sum-exps: o = (o_p·e^{l_p} + o_c·e^{l_c}) / (e^{l_p} + e^{l_c}), l = log(e^{l_p} + e^{l_c}).
// Backward: each part's flash backward with the merged o and l, which is the gradient of
// the attention over all the keys (its probabilities are exp(s − l) on each part; the
// row sums Σ dO·O are of the merged o), summed for q. No [Lq, n_past + Lq] mask or
// score matrix exists (SDPA with a mask holds one as floats).
struct ChunkAttention : public torch::autograd::Function<ChunkAttention> {
  using Ctx = torch::autograd::AutogradContext;
  static at::Tensor forward(Ctx* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t n_past) {
    at::Tensor o, lse;  // [1, H, Lq, D] in q's dtype, [1, H, Lq] fp32
    if (n_past == 0) {
      std::tie(o, lse) = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, /*is_causal=*/true);
    } else {
      const int64_t Lq = q.size(2);
      auto [o_p, l_p] = at::_scaled_dot_product_flash_attention_for_cpu(q, k.narrow(2, 0, n_past),
                                                                        v.narrow(2, 0, n_past), 0.0, false);
      auto [o_c, l_c] = at::_scaled_dot_product_flash_attention_for_cpu(q, k.narrow(2, n_past, Lq),
                                                                        v.narrow(2, n_past, Lq), 0.0, true);
      const at::Tensor m = at::maximum(l_p, l_c), w_p = (l_p - m).exp(), w_c = (l_c - m).exp();  // [1, H, Lq]
      lse = m + (w_p + w_c).log();
      o = ((o_p.to(at::kFloat) * w_p.unsqueeze(-1) + o_c.to(at::kFloat) * w_c.unsqueeze(-1)) /
           (w_p + w_c).unsqueeze(-1)).to(q.scalar_type());
    }
    ctx->save_for_backward({q, k, v, o, lse});
    ctx->saved_data["n_past"] = n_past;
    return o;
  }
  static torch::autograd::variable_list backward(Ctx* ctx, torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &o = saved[3], &lse = saved[4];
    const int64_t n_past = ctx->saved_data["n_past"].toInt(), Lq = q.size(2);
    const at::Tensor g = grads[0].contiguous();
    if (n_past == 0) {
      auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(g, q, k, v, o, lse, 0.0, true);
      return {dq, dk, dv, at::Tensor()};
    }
    auto [dq_p, dk_p, dv_p] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        g, q, k.narrow(2, 0, n_past), v.narrow(2, 0, n_past), o, lse, 0.0, false);
    auto [dq_c, dk_c, dv_c] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        g, q, k.narrow(2, n_past, Lq), v.narrow(2, n_past, Lq), o, lse, 0.0, true);
    return {dq_p + dq_c, at::cat({dk_p, dk_c}, 2), at::cat({dv_p, dv_c}, 2), at::Tensor()};
  }
};

// q [Lq, H, D] at positions n_past.., k/v [n_past + Lq, Hkv, D] -> [Lq, H, D]: ChunkAttention
// on the CPU, attend_one_sequence elsewhere.
at::Tensor attend_chunk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t n_past) {
  if (!q.device().is_cpu()) return attend_one_sequence(q, k, v, n_past);
  auto heads_first = [](const at::Tensor& x) { return x.transpose(0, 1).unsqueeze(0); };  // [1, heads, L, D]
  return ChunkAttention::apply(heads_first(q), heads_first(k), heads_first(v), n_past).squeeze(0).transpose(0, 1);
}

// Context parallelism: this rank's queries q [T_i, H, D] against every key of their
// sequences, k_all/v_all [T, Hkv, D] (gathered from the group) -> [T_i, H * D]. Each
// chunk attends as a prefill chunk does to its cached past: padded below the budget,
// each chunk alone above it (attend_chunk: no mask, no scores).
at::Tensor attend_gathered(const at::Tensor& q, const at::Tensor& k_all, const at::Tensor& v_all,
                           const AttentionLayout& a, const AttentionPlan& plan) {
  const ContextSplit& split = *a.context;
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), Hkv = k_all.size(1);
  if (a.n_seqs > 0 && a.n_seqs * H * a.max_new * a.max_keys > plan.padded_budget) {
    std::vector<at::Tensor> out;
    for (const auto& ch : split.chunks())
      out.push_back(attend_chunk(q.narrow(0, ch.local_start, ch.end - ch.begin), k_all.narrow(0, ch.seq_start, ch.end),
                                 v_all.narrow(0, ch.seq_start, ch.end), ch.begin));
    return at::cat(out).reshape({T, H * D});
  }
  // (A rank holding no token still takes this path: its empty products keep the gathers
  // in its backward, which the other ranks' reduce-scatters meet.)
  const at::Tensor kp = k_all.index_select(0, a.key_rows).view({a.n_seqs, a.max_keys, Hkv, D});
  const at::Tensor vp = v_all.index_select(0, a.key_rows).view({a.n_seqs, a.max_keys, Hkv, D});
  return attend_padded(pad(q, a), kp, vp, a.q_pos, a.n_keys).index({a.b_of_t, a.j_of_t}).reshape({T, H * D});
}

// Exact numerics under context parallelism: every query row through the batch-invariant
// kernel over the gathered keys of its sequence (the rows a.key_rows names), in order,
// as attend_exact reads a whole sequence's: a row's bits do not depend on the split.
// Under autograd the gradient is attend_gathered's.
at::Tensor attend_gathered_exact(const at::Tensor& q, const at::Tensor& k_all, const at::Tensor& v_all,
                                 const AttentionLayout& a, const AttentionPlan& plan) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  const at::Tensor chunk_of_row = a.b_of_t.cpu(), n_keys = a.positions.cpu() + 1;  // [T_i] each
  const at::Tensor key_rows = a.key_rows.cpu().view({a.n_seqs, a.max_keys});       // [chunks, max_keys]
  const at::ScalarType storage = exact_kv_storage();
  RecomputedBlock exact = [key_rows, chunk_of_row, n_keys, T, H, D, storage](const std::vector<at::Tensor>& in) {
    const at::Tensor k = kv_storage_values(in[1], storage), v = kv_storage_values(in[2], storage);  // fp32
    return std::vector{attention_rows(in[0].to(at::kFloat), k, v, key_rows, chunk_of_row, n_keys)
                           .reshape({T, H * D})
                           .to(in[2].scalar_type())};
  };
  return value_with_gradient_of(
      exact,
      [layout = a, plan](const std::vector<at::Tensor>& in) {
        return std::vector{attend_gathered(in[0], in[1], in[2], layout, plan)};
      },
      {q, k_all, v_all})[0];
}

// Exact numerics (model/exact_ops.h): every query row through the batch-invariant kernel,
// the packed batch's keys read in place (sequence b's at rows start_b ..), a cached
// batch's where they lie in the cache. Token t sees positions[t] + 1 keys. The value is
// rounded to v's dtype, as attend_packed's (a bf16 forward's bf16); under autograd the
// gradient is attend_packed's.
at::Tensor attend_exact(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionLayout& a,
                        KvCache* cache, int64_t layer, const AttentionPlan& plan) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  const at::Tensor seq_of_row = a.b_of_t.cpu(), n_keys = a.positions.cpu() + 1;  // [T] each
  if (cache) {
    SLIMPI_CHECK(cache->k[layer].scalar_type() == exact_kv_storage(),
                 "exact numerics: a key/value cache of {} (exact_kv_storage) expected, not {}",
                 c10::toString(exact_kv_storage()), c10::toString(cache->k[layer].scalar_type()));
    // (A latent cache's values are its keys: v and v_scale alias k and k_scale, KvCache.)
    return attention_rows(q.to(at::kFloat), cache->k[layer], cache->v[layer],
                          a.key_slots.cpu().view({a.n_seqs, a.max_keys}), seq_of_row, n_keys,
                          cache->quantized() ? cache->k_scale[layer] : at::Tensor(),
                          cache->quantized() ? cache->v_scale[layer] : at::Tensor())
        .reshape({T, H * D})
        .to(v.scalar_type());
  }
  // The keys and values as the engines' cache holds them (fp32, or rounded to its bf16 or e4m3).
  const at::ScalarType storage = exact_kv_storage();
  std::vector<int64_t> slots(size_t(a.n_seqs * a.max_new), 0);  // [B, max_new]: sequence b's rows
  for (int64_t b = 0, start = 0; b < a.n_seqs; start += a.seq_lens[size_t(b)], ++b)
    for (int64_t j = 0; j < a.seq_lens[size_t(b)]; ++j) slots[size_t(b * a.max_new + j)] = start + j;
  const at::Tensor key_slots = at::tensor(slots, at::kLong).view({a.n_seqs, a.max_new});
  // (captured by value: the backward runs after the caller's layout is gone)
  RecomputedBlock exact = [key_slots, seq_of_row, n_keys, T, H, D, storage](const std::vector<at::Tensor>& in) {
    const at::Tensor k = kv_storage_values(in[1], storage), v = kv_storage_values(in[2], storage);  // fp32
    return std::vector{attention_rows(in[0].to(at::kFloat), k, v, key_slots, seq_of_row, n_keys)
                           .reshape({T, H * D})
                           .to(in[2].scalar_type())};
  };
  return value_with_gradient_of(
      exact,
      [layout = a, plan](const std::vector<at::Tensor>& in) {
        return std::vector{attend_packed(in[0], in[1], in[2], layout, plan)};
      },
      {q, k, v})[0];
}

}  // namespace

at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionLayout& a,
                  KvCache* cache, int64_t layer, const AttentionPlan& plan) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  if (cache) cache->store(layer, a.new_slots, k, v);
  if (a.context) {  // context parallelism: every key of the rank's sequences from the group
    SLIMPI_CHECK(!cache, "context-parallel attention runs packed forwards only");
    const at::Tensor k_all = a.context->gather_rows(k), v_all = a.context->gather_rows(v);  // [T, Hkv, D]
    return exact_numerics() ? attend_gathered_exact(q, k_all, v_all, a, plan) : attend_gathered(q, k_all, v_all, a, plan);
  }
  if (exact_numerics()) return attend_exact(q, k, v, a, cache, layer, plan);
  if (!cache) return attend_packed(q, k, v, a, plan);
  if (a.parts.empty()) return attend_cached(a, q, *cache, layer, k.scalar_type(), plan).reshape({T, H * D});
  std::vector<at::Tensor> outs;  // [T_part, H, D] each, in the forward's compute dtype
  for (const auto& part : a.parts)
    outs.push_back(attend_cached(part.layout, q.index_select(0, part.token_index), *cache, layer, k.scalar_type(), plan));
  at::Tensor attn = at::empty({T, H, D}, outs.front().options());
  for (size_t i = 0; i < outs.size(); ++i)  // parts may differ: the paged kernel answers in q's dtype
    attn.index_copy_(0, a.parts[i].token_index, outs[i].to(attn.scalar_type()));
  return attn.reshape({T, H * D});
}

at::Tensor attend_padded(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& q_pos,
                         const at::Tensor& n_keys) {
  const int64_t B = q.size(0), Lq = q.size(1), H = q.size(2), D = q.size(3);
  const int64_t Lk = k.size(1), Hkv = k.size(2), g = H / Hkv;
  at::Tensor qh = q.reshape({B, Lq, Hkv, g, D}).permute({0, 2, 3, 1, 4});  // [B, Hkv, g, Lq, D]
  at::Tensor kh = k.permute({0, 2, 3, 1}).unsqueeze(2);                    // [B, Hkv, 1, D, Lk]
  at::Tensor vh = v.permute({0, 2, 1, 3}).unsqueeze(2);                    // [B, Hkv, 1, Lk, D]
  at::Tensor scores = at::matmul(qh, kh) * (1.0 / std::sqrt(double(D)));  // [B, Hkv, g, Lq, Lk]
  at::Tensor key = at::arange(Lk, q_pos.options()).view({1, 1, Lk});       // [1, 1, Lk]
  at::Tensor hidden = (key > q_pos.unsqueeze(2)) | (key >= n_keys.view({B, 1, 1}));  // [B, Lq, Lk]
  scores = scores.masked_fill(hidden.view({B, 1, 1, Lq, Lk}), -std::numeric_limits<float>::infinity());
  at::Tensor probs = at::softmax(scores.to(at::kFloat), -1).to(v.scalar_type());
  return at::matmul(probs, vh).permute({0, 3, 1, 2, 4}).reshape({B, Lq, H, D});  // [B, Lq, H, D]
}

// Through torch's scaled_dot_product_attention (a flash kernel on CPU and GPU: score
// memory O(block) per head, never O(L²)). Query i sees keys 0..n_past+i: the causal flag
// when n_past = 0, else a [Lq, Lk] boolean mask (SDPA's causal flag aligns the diagonal
// top-left). Grouped keys and values are not repeated per query head (enable_gqa: the
// same numbers as repeating them, bit for bit on the CPU, without H / Hkv copies; latent
// attention's one head of r + R would otherwise be copied H times at every prefill).
at::Tensor attend_one_sequence(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t n_past) {
  const int64_t Lq = q.size(0), Lk = k.size(0);
  auto heads_first = [](const at::Tensor& x) { return x.transpose(0, 1).unsqueeze(0); };  // [1, heads, L, D]
  std::optional<at::Tensor> mask;
  if (n_past > 0) {
    const auto opts = at::TensorOptions().dtype(at::kLong).device(q.device());
    mask = at::arange(Lk, opts).view({1, Lk}) <= (at::arange(Lq, opts) + n_past).view({Lq, 1});  // [Lq, Lk]
  }
  return at::scaled_dot_product_attention(heads_first(q), heads_first(k), heads_first(v), mask, 0.0,
                                          /*is_causal=*/n_past == 0, std::nullopt,
                                          /*enable_gqa=*/q.size(1) != k.size(1))
      .squeeze(0)
      .transpose(0, 1);  // [Lq, H, D]
}

}  // namespace slimpi
