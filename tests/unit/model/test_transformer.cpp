// The policy model: packed forward == per-sequence forward; incremental (KV cache)
// forward == full forward; deterministic init; HF parameter names and counts.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Float8_e4m3fn.h>
#include <gtest/gtest.h>
#include <slimpi/error.h>

#include <bit>
#include <cmath>
#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>

#include "io/safetensors.h"
#include "io/tensor_io.h"
#include "kernels/e4m3.h"
#include "kernels/paged_attention.h"
#include "model/precision.h"
#include "model/transformer.h"
#include "model/log_probs.h"
#include "../../support/tiny_model.h"

namespace slimpi {
namespace {

// The model families' shapes beyond Llama / Qwen: GLM-4.5's (RoPE over half of each
// head, and DeepSeekMoE layers after a dense first one: sigmoid router with a correction
// bias, 2 groups of which a token uses 1, weights scaled by 2.5, one shared expert), and
// DeepSeek-V3's (the same MoE, multi-head latent attention with a query latent,
// interleaved rotary pairs and values narrower than keys; no biases), and Qwen3.5's (three
// Gated DeltaNet layers and a gated full-attention one rotating a quarter of each head,
// zero-centred norms).
enum Variant { kPlain = 0, kGlm = 1, kDeepSeek = 2, kQwen35 = 3 };
ModelConfig tiny(bool gqa, bool bias, bool tied, int variant = kPlain) {
  ModelConfig c;
  c.vocab_size = 50;
  c.hidden_size = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = gqa ? 2 : 4;
  c.intermediate_size = 48;
  c.max_seq_len = 64;
  c.qkv_bias = bias;
  c.tie_word_embeddings = tied;
  c.init_std = 0.2;  // larger than usual: makes attention patterns matter in the checks
  if (variant == kQwen35) {
    testing::use_gated_delta_net(c);
    return c;
  }
  if (variant != kPlain) {
    c.partial_rotary_factor = variant == kGlm ? 0.5 : 1.0;
    c.n_experts = 4;
    c.n_experts_per_tok = 2;
    c.moe_intermediate_size = 16;
    testing::use_deepseek_moe(c, /*n_group=*/2, /*topk_group=*/1, /*first_k_dense=*/1);
  }
  if (variant == kDeepSeek) testing::use_latent_attention(c);
  return c;
}

// The bar two fp32 evaluations of the same logits in another order meet: 1e-5, or for the
// Qwen3.5 shape 1e-4. Its gated norm rescales each value head's output o to unit RMS, and
// in this tiny model (init_std 0.2, 8-wide heads) o is often ~1e-2, so its fp32 round-off
// (~1e-8 absolute) grows by 1/rms(o) before the later layers amplify it: packed against
// alone differ by 3.5e-5 here, and by less than 1e-5 with the linear layers in fp64
// (measured by hand on 2026-12-06).
double fp32_bar(int variant) { return variant == kQwen35 ? 1e-4 : 1e-5; }

at::Tensor random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return at::randint(vocab, {n}, g, at::kLong);
}

class TransformerShapes : public ::testing::TestWithParam<std::tuple<bool, bool, bool, int>> {};

TEST_P(TransformerShapes, PackedEqualsPerSequence) {
  auto [gqa, bias, tied, variant] = GetParam();
  Transformer m(tiny(gqa, bias, tied, variant), 7, at::kCPU);
  if (bias)  // biases start at zero; make them matter
    for (auto& p : m.parameters())
      if (p.name.find("bias") != std::string::npos) p.tensor.data().normal_(0, 0.5);
  std::vector<int64_t> lens{5, 1, 17, 9};
  at::Tensor tokens = random_tokens(32, 50, 1);
  at::NoGradGuard no_grad;
  at::Tensor packed = m.forward_packed(tokens, lens);  // [32, V]
  int64_t start = 0;
  for (int64_t n : lens) {
    at::Tensor alone = m.forward_packed(tokens.narrow(0, start, n), {n});
    EXPECT_TRUE(at::allclose(packed.narrow(0, start, n), alone, fp32_bar(variant), fp32_bar(variant)))
        << "sequence at " << start << ": " << (packed.narrow(0, start, n) - alone).abs().max().item<double>();
    start += n;
  }
}

TEST_P(TransformerShapes, IncrementalEqualsFull) {
  auto [gqa, bias, tied, variant] = GetParam();
  ModelConfig cfg = tiny(gqa, bias, tied, variant);
  Transformer m(cfg, 11, at::kCPU);
  at::NoGradGuard no_grad;
  // Two sequences, prefilled in chunks of different sizes while the other decodes, then
  // decoded one token at a time, in a cache with scattered (non-contiguous) slots; with
  // each way the decode rows read the cache, and with prefill chunks attending as a
  // padded batch (default budget) or each sequence alone through SDPA (budget 0).
  at::Tensor a = random_tokens(13, 50, 2), b = random_tokens(8, 50, 3);
  at::Tensor full_a = m.forward_packed(a, {13}), full_b = m.forward_packed(b, {8});
  at::Tensor slots_a = at::arange(0, 26, 2, at::kLong), slots_b = at::arange(40, 56, 2, at::kLong);
  using Mode = Transformer::DecodeAttention;
  for (auto [mode, budget] : {std::pair{Mode::Auto, Transformer::kPaddedAttentionBudget}, std::pair{Mode::Auto, 0L},
                              std::pair{Mode::Paged, 0L}, std::pair{Mode::Gather, Transformer::kPaddedAttentionBudget},
                              std::pair{Mode::FreshGather, Transformer::kPaddedAttentionBudget}}) {
    SCOPED_TRACE("decode attention mode " + std::to_string(int(mode)) + ", padded budget " + std::to_string(budget));
    m.set_decode_attention(mode);
    m.set_padded_attention_budget(budget);
    KvCache cache = KvCache::allocate(cfg, 64, at::kFloat, 1, 0, true, /*n_state_slots=*/3);
    if (variant == kDeepSeek) {  // the latent cache: one row of kv_lora_rank + qk_rope_head_dim a token
      EXPECT_EQ(cache.k[0].sizes(), (std::vector<int64_t>{64, 1, 16 + 4}));
      EXPECT_EQ(cache.bytes_per_token(), 2 * (16 + 4) * 4);  // 2 layers, the values read from the keys, fp32
      EXPECT_TRUE(cache.values_are_keys);
      EXPECT_TRUE(cache.v[0].is_same(cache.k[0]));
    }
    if (variant == kQwen35) {  // the linear layers cache no K/V: only layer 3's rows, keys and values
      EXPECT_EQ(cache.k[0].size(1), 0);
      EXPECT_EQ(cache.v[0].size(1), 0);
      EXPECT_EQ(cache.bytes_per_token(), 2 * cfg.n_kv_heads * cfg.head_dim() * 4);
      EXPECT_EQ(cache.state_bytes_per_sequence(), 3 * 4 * (64 * 3 + 4 * 8 * 8));  // 3 layers: conv + delta state, fp32
      EXPECT_EQ(cache.state_bytes_per_sequence(), 4 * cfg.linear_state_size());
    }
    // (new a, new b); {1, 2} and {4, 1} mix a decode row with a prefill chunk, which
    // attend in separate calls (decode first, then prefill first).
    std::vector<std::pair<int64_t, int64_t>> steps{{5, 3}, {1, 2}, {4, 1}, {1, 1}, {1, 1}, {1, 0}};
    int64_t pa = 0, pb = 0;
    for (auto [na, nb] : steps) {
      std::vector<CachedSequence> seqs;
      std::vector<at::Tensor> toks;
      if (na) {
        seqs.push_back({pa, na, slots_a.narrow(0, 0, pa + na), /*state_slot=*/2});
        toks.push_back(a.narrow(0, pa, na));
      }
      if (nb) {
        seqs.push_back({pb, nb, slots_b.narrow(0, 0, pb + nb), /*state_slot=*/0});
        toks.push_back(b.narrow(0, pb, nb));
      }
      at::Tensor logits = m.forward_incremental(at::cat(toks), seqs, cache);
      const double bar = fp32_bar(variant);
      EXPECT_TRUE(at::allclose(logits.narrow(0, 0, na), full_a.narrow(0, pa, na), bar, bar)) << "a at " << pa;
      if (nb)
        EXPECT_TRUE(at::allclose(logits.narrow(0, na, nb), full_b.narrow(0, pb, nb), bar, bar)) << "b at " << pb;
      pa += na;
      pb += nb;
    }
    EXPECT_EQ(pa, 13);
    EXPECT_EQ(pb, 8);
  }
}

// Multi-head latent attention's two incremental forms, the latent cache with the absorbed
// product (the engine's) and the expanded keys and values cached per head, both give
// the full forward's logits, step by step.
TEST(Transformer, LatentAndExpandedCachesGiveTheFullForward) {
  const ModelConfig cfg = tiny(true, false, false, kDeepSeek);
  Transformer m(cfg, 13, at::kCPU);
  at::NoGradGuard no_grad;
  const at::Tensor a = random_tokens(12, 50, 4);
  const at::Tensor full = m.forward_packed(a, {12});
  const at::Tensor slots = at::arange(0, 24, 2, at::kLong);
  for (bool latent : {true, false}) {
    m.set_latent_cache(latent);
    KvCache cache = KvCache::allocate(cfg, 32, at::kFloat, 1, 0, latent);
    EXPECT_EQ(cache.k[0].size(1), latent ? 1 : cfg.n_heads);
    int64_t past = 0;
    for (int64_t n : {5, 1, 3, 1, 1, 1}) {
      const at::Tensor logits = m.forward_incremental(a.narrow(0, past, n), {{past, n, slots.narrow(0, 0, past + n)}}, cache);
      EXPECT_TRUE(at::allclose(logits, full.narrow(0, past, n), 1e-5, 1e-5)) << (latent ? "latent" : "expanded") << " at " << past;
      past += n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, TransformerShapes,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(int(kPlain), int(kGlm), int(kDeepSeek), int(kQwen35))));

// The paged kernel's e4m3 decoding (bit arithmetic, kernels/e4m3.h) is torch's
// conversion, bit for bit, for every non-NaN code (a NaN for the two NaN codes).
TEST(PagedDecodeAttention, E4m3CodesConvertAsTorchDoes) {
  for (int c = 0; c < 256; ++c) {
    const float want = static_cast<float>(c10::Float8_e4m3fn(uint8_t(c), c10::Float8_e4m3fn::from_bits()));
    const float got = e4m3_to_float(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << "code " << c << ": " << got << " vs " << want;
    }
  }
}

// An e4m3 cache's gathered rows de-quantised in one pass (KvCache::decoded on the CPU)
// equal torch's (codes.to(float) * scale).to(dtype) bit for bit, fp32 and bf16, every
// non-NaN code at every head's scale.
TEST(PagedDecodeAttention, E4m3RowsDecodeAsTorchDoes) {
  const ModelConfig cfg = tiny(/*gqa=*/true, false, false);
  KvCache cache = KvCache::allocate(cfg, 8, at::TensorOptions().dtype(at::kFloat8_e4m3fn));
  const int64_t Hkv = cache.k[0].size(1), D = cache.k[0].size(2);
  cache.k_scale[0].copy_(at::linspace(0.37, 3.1, Hkv));
  std::vector<uint8_t> codes;
  for (int c = 0; codes.size() < size_t(254 * 3 / (Hkv * D) + 1) * size_t(Hkv * D); ++c)
    if ((c & 0x7f) != 0x7f) codes.push_back(uint8_t(c % 256));  // every code but the NaNs, cyclically
  const int64_t n = int64_t(codes.size()) / (Hkv * D);
  const at::Tensor rows = at::from_blob(codes.data(), {n, Hkv, D}, at::kByte).clone().view(at::kFloat8_e4m3fn);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor want = (rows.to(at::kFloat) * cache.k_scale[0].view({1, Hkv, 1})).to(dtype);
    const at::Tensor got = cache.decoded(rows, 0, /*key=*/true, dtype);
    ASSERT_EQ(got.scalar_type(), dtype);
    EXPECT_TRUE(at::equal(got, want)) << c10::toString(dtype);
  }
}

// The paged kernel against dense attention over the same keys gathered in order:
// scattered slots, grouped-query heads, fp32 and bf16 caches, one key to many.
TEST(PagedDecodeAttention, EqualsDenseAttentionOverTheGatheredKeys) {
  const int64_t n_slots = 64, H = 4, Hkv = 2, D = 8, g = H / Hkv;
  at::Generator gen = at::detail::createCPUGenerator(5);
  const std::vector<int64_t> n_keys{1, 7, 19};
  const int64_t B = 3, max_keys = 19;
  at::Tensor slots = at::zeros({B, max_keys}, at::kLong);
  at::Tensor perm = at::randperm(n_slots, gen, at::kLong);  // every key of every sequence in its own slot
  for (int64_t b = 0, used = 0; b < B; used += n_keys[b], ++b)
    slots[b].narrow(0, 0, n_keys[b]).copy_(perm.narrow(0, used, n_keys[b]));
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(std::string(c10::toString(dtype)));
    at::Tensor k = at::randn({n_slots, Hkv, D}, gen).to(dtype), v = at::randn({n_slots, Hkv, D}, gen).to(dtype);
    at::Tensor q = at::randn({B, H, D}, gen).to(dtype);
    at::Tensor out = paged_decode_attention(q, k, v, slots, at::tensor(n_keys, at::kLong));  // [B, H, D]
    ASSERT_EQ(out.scalar_type(), dtype);
    for (int64_t b = 0; b < B; ++b) {
      at::Tensor idx = slots[b].narrow(0, 0, n_keys[b]);
      at::Tensor kb = k.index_select(0, idx).to(at::kFloat).repeat_interleave(g, 1).transpose(0, 1);  // [H, n, D]
      at::Tensor vb = v.index_select(0, idx).to(at::kFloat).repeat_interleave(g, 1).transpose(0, 1);  // [H, n, D]
      at::Tensor qb = q[b].to(at::kFloat).unsqueeze(1);                                              // [H, 1, D]
      at::Tensor p = at::softmax(at::matmul(qb, kb.transpose(1, 2)) / std::sqrt(double(D)), -1);     // [H, 1, n]
      at::Tensor want = at::matmul(p, vb).squeeze(1).to(dtype);                                      // [H, D]
      const double tol = dtype == at::kFloat ? 1e-6 : 1e-2;
      EXPECT_TRUE(at::allclose(out[b].to(at::kFloat), want.to(at::kFloat), tol, tol)) << "sequence " << b;
    }
  }
  {  // an e4m3 cache with per-kv-head scales: the keys read as their e4m3 values times their head's scale
    SCOPED_TRACE("e4m3");
    const at::Tensor k = at::randn({n_slots, Hkv, D}, gen).to(at::kFloat8_e4m3fn),
                     v = at::randn({n_slots, Hkv, D}, gen).to(at::kFloat8_e4m3fn), q = at::randn({B, H, D}, gen);
    const at::Tensor k_scale = at::tensor({0.5f, 2.0f}), v_scale = at::tensor({3.0f, 0.25f});
    const at::Tensor out = paged_decode_attention(q, k, v, slots, at::tensor(n_keys, at::kLong), k_scale, v_scale);
    const at::Tensor kf = k.to(at::kFloat) * k_scale.view({1, Hkv, 1}), vf = v.to(at::kFloat) * v_scale.view({1, Hkv, 1});
    const at::Tensor want = paged_decode_attention(q, kf, vf, slots, at::tensor(n_keys, at::kLong));
    EXPECT_TRUE(at::allclose(out, want, 1e-6, 1e-6)) << (out - want).abs().max().item<float>();
    EXPECT_THROW(paged_decode_attention(q, k, v, slots, at::tensor(n_keys, at::kLong)), Error);  // no scales
  }
  at::Tensor bad = slots.clone();
  bad[1][3] = n_slots;  // one slot past the cache: refused before anything is read
  EXPECT_THROW(paged_decode_attention(at::randn({B, H, D}), at::randn({n_slots, Hkv, D}), at::randn({n_slots, Hkv, D}),
                                      bad, at::tensor(n_keys, at::kLong)),
               Error);
}

TEST(Transformer, DeterministicInitAndHuggingFaceNames) {
  ModelConfig cfg = tiny(true, true, false);
  Transformer a(cfg, 5, at::kCPU), b(cfg, 5, at::kCPU), c(cfg, 6, at::kCPU);
  ASSERT_EQ(a.parameters().size(), b.parameters().size());
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    EXPECT_TRUE(at::equal(a.parameters()[i].tensor, b.parameters()[i].tensor)) << a.parameters()[i].name;
  }
  EXPECT_FALSE(at::equal(a.parameter("model.layers.0.self_attn.q_proj.weight"),
                         c.parameter("model.layers.0.self_attn.q_proj.weight")));
  EXPECT_EQ(a.parameters().front().name, "model.embed_tokens.weight");
  EXPECT_EQ(a.parameters().back().name, "lm_head.weight");
  EXPECT_EQ(a.parameter("model.layers.1.self_attn.k_proj.weight").sizes(), (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(a.parameter("model.layers.1.mlp.down_proj.weight").sizes(), (std::vector<int64_t>{32, 48}));
  EXPECT_EQ(a.n_params(), cfg.n_params());
  Transformer tied(tiny(false, false, true), 5, at::kCPU);
  EXPECT_EQ(tied.n_params(), tiny(false, false, true).n_params());
  EXPECT_THROW(tied.parameter("lm_head.weight"), Error);
}

// Packed attention without padding (per-sequence flash attention) against the padded
// batch: same logits and gradients on mixed lengths, with and without grouped-query
// heads, in fp32 (and close in bf16).
TEST_P(TransformerShapes, UnpaddedAttentionEqualsPadded) {
  auto [gqa, bias, tied, variant] = GetParam();
  // The families' attention only (an MoE routing could flip on round-off between the paths).
  ModelConfig cfg = tiny(gqa, bias, tied, variant);
  cfg.n_experts = 0;
  Transformer padded(cfg, 11, at::kCPU), unpadded(cfg, 11, at::kCPU);
  padded.set_padded_attention_budget(int64_t(1) << 40);
  unpadded.set_padded_attention_budget(0);
  const std::vector<int64_t> lens{1, 64, 7, 33, 2};
  const at::Tensor tokens = random_tokens(107, cfg.vocab_size, 8);
  const at::Tensor a = padded.forward_packed(tokens, lens), b = unpadded.forward_packed(tokens, lens);
  EXPECT_TRUE(at::allclose(a, b, fp32_bar(variant), fp32_bar(variant))) << "max |diff| " << (a - b).abs().max().item<double>();
  at::log_softmax(a, 1).select(1, 4).sum().backward();
  at::log_softmax(b, 1).select(1, 4).sum().backward();
  for (size_t i = 0; i < padded.parameters().size(); ++i) {
    const at::Tensor& ga = padded.parameters()[i].tensor.grad();
    const at::Tensor& gb = unpadded.parameters()[i].tensor.grad();
    // fp32 round-off relative to the gradient's scale (the two paths sum in other orders)
    EXPECT_LT((ga - gb).abs().max().item<double>(), fp32_bar(variant) * std::max(ga.abs().max().item<double>(), 1e-3))
        << padded.parameters()[i].name;
  }
  at::NoGradGuard no_grad;
  ForwardPrecision bf16(Precision::BF16, at::kCPU);
  const at::Tensor a16 = padded.forward_packed(tokens, lens), b16 = unpadded.forward_packed(tokens, lens);
  EXPECT_LT((a16 - b16).abs().max().item<double>(), 0.05 * a.abs().max().item<double>());
}

TEST(Transformer, LongPackedBatchesAttendWithoutPadding) {
  // The default budget sends a long batch down the unpadded path: 8 x 512 tokens here
  // would be 8 x 4 x 512² padded scores per layer; the result equals per-sequence runs.
  ModelConfig cfg = tiny(true, false, false);
  cfg.max_seq_len = 512;
  Transformer m(cfg, 3, at::kCPU);
  EXPECT_GT(8 * cfg.n_heads * 512 * 512, m.padded_attention_budget());
  const at::Tensor tokens = random_tokens(8 * 512, cfg.vocab_size, 2);
  at::NoGradGuard no_grad;
  const at::Tensor all = m.forward_packed(tokens, std::vector<int64_t>(8, 512));
  for (int64_t s : {0, 5}) {
    const at::Tensor one = m.forward_packed(tokens.narrow(0, s * 512, 512), {512});
    EXPECT_TRUE(at::allclose(all.narrow(0, s * 512, 512), one, 1e-5, 1e-5));
  }
}

// bf16 (model/precision.h): a bf16 forward stays close to the fp32 one; fp32 masters in a
// bf16 forward compute exactly what a bf16-weight copy computes (what lets a bf16 engine
// match bf16 training); gradients still reach the fp32 masters in fp32.
TEST(Transformer, Bf16ForwardOfMastersEqualsBf16Weights) {
  ModelConfig cfg = tiny(true, true, false);
  Transformer masters(cfg, 5, at::kCPU), bf16_weights(cfg, 5, at::kCPU, at::kBFloat16);
  EXPECT_EQ(bf16_weights.flat_parameters().scalar_type(), at::kBFloat16);
  EXPECT_EQ(bf16_weights.flat_parameters().numel(), masters.flat_parameters().numel());
  EXPECT_TRUE(at::equal(bf16_weights.flat_parameters(), masters.flat_parameters().to(at::kBFloat16)));
  const at::Tensor tokens = random_tokens(40, cfg.vocab_size, 3);
  at::Tensor fp32, from_masters, from_bf16;
  {
    at::NoGradGuard no_grad;
    fp32 = masters.forward_packed(tokens, {25, 15});
    ForwardPrecision bf16(Precision::BF16, at::kCPU);
    from_masters = masters.forward_packed(tokens, {25, 15});
    from_bf16 = bf16_weights.forward_packed(tokens, {25, 15});
  }
  EXPECT_EQ(from_masters.scalar_type(), at::kFloat);  // logits are fp32
  EXPECT_TRUE(at::equal(from_masters, from_bf16));
  const double gap = (from_masters - fp32).abs().max().item<double>();
  EXPECT_GT(gap, 1e-4);  // bf16 did act
  EXPECT_LT(gap, 0.1 * fp32.abs().max().item<double>());
  // Outside the guard the precision is fp32 again.
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(masters.forward_packed(tokens, {25, 15}), fp32));
}

// A bf16 engine's incremental forward, decode rows next to prefill chunks: by default
// (Auto) it runs the trainer's own bf16 attention ops, so its logits are the trainer's
// to round-off of the summation order; the paged kernel (fp32 accumulation) is close.
// A bf16 forward of the Qwen3.5 shape: its linear layers run the convolution, the delta
// rule, the state and the gated norm in fp32 (only the projections round), so the bf16
// trainer's chunked forward and a bf16 engine's prefill and recurrent decode steps (the
// state carried between forwards in fp32) give the same logits to fp32 round-off as
// amplified in this random model (test_transformer's fp32_bar), not to bf16's.
TEST(Transformer, Bf16HybridIncrementalKeepsTheStateInFp32) {
  const ModelConfig cfg = tiny(true, false, false, kQwen35);
  Transformer m(cfg, 6, at::kCPU, at::kBFloat16);
  at::NoGradGuard no_grad;
  ForwardPrecision bf16(Precision::BF16, at::kCPU);
  const at::Tensor a = random_tokens(20, cfg.vocab_size, 4);
  const at::Tensor full = m.forward_packed(a, {20});
  KvCache cache = KvCache::allocate(cfg, 32, at::TensorOptions().dtype(at::kBFloat16), 1, 0, true, 1);
  EXPECT_EQ(cache.delta_state[0].scalar_type(), at::kFloat);
  const at::Tensor slots = at::arange(0, 20, at::kLong);
  int64_t past = 0;
  for (int64_t n : {7, 1, 1, 5, 1, 1, 1, 1, 1, 1}) {
    const at::Tensor logits = m.forward_incremental(a.narrow(0, past, n), {{past, n, slots.narrow(0, 0, past + n), 0}}, cache);
    EXPECT_TRUE(at::allclose(logits, full.narrow(0, past, n), fp32_bar(kQwen35), fp32_bar(kQwen35)))
        << "at " << past << ": " << (logits - full.narrow(0, past, n)).abs().max().item<float>();
    past += n;
  }
  EXPECT_EQ(past, 20);
}

TEST(Transformer, Bf16IncrementalWithMixedDecodeAndPrefill) {
  ModelConfig cfg = tiny(true, false, false);
  Transformer m(cfg, 6, at::kCPU, at::kBFloat16);
  at::NoGradGuard no_grad;
  ForwardPrecision bf16(Precision::BF16, at::kCPU);
  const at::Tensor a = random_tokens(12, cfg.vocab_size, 4), b = random_tokens(9, cfg.vocab_size, 5);
  const at::Tensor full_a = m.forward_packed(a, {12}), full_b = m.forward_packed(b, {9});
  const at::Tensor slots_a = at::arange(0, 12, at::kLong), slots_b = at::arange(20, 29, at::kLong);
  using Mode = Transformer::DecodeAttention;
  for (auto [mode, tol] : {std::pair{Mode::Auto, 1e-4}, std::pair{Mode::Paged, 0.1}}) {
    SCOPED_TRACE("mode " + std::to_string(int(mode)));
    m.set_decode_attention(mode);
    KvCache cache = KvCache::allocate(cfg, 32, at::TensorOptions().dtype(at::kBFloat16));
    m.forward_incremental(a.narrow(0, 0, 8), {{0, 8, slots_a.narrow(0, 0, 8)}}, cache);
    // a decodes one token while b prefills 9
    const at::Tensor logits = m.forward_incremental(at::cat({a.narrow(0, 8, 1), b}),
                                                    {{8, 1, slots_a.narrow(0, 0, 9)}, {0, 9, slots_b}}, cache);
    EXPECT_EQ(logits.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::allclose(logits[0], full_a[8], tol, tol)) << (logits[0] - full_a[8]).abs().max().item<float>();
    EXPECT_TRUE(at::allclose(logits.narrow(0, 1, 9), full_b, tol, tol));
  }
}

// logit_rows: the LM head on the chosen rows only (an engine's prompt chunks need their
// last row's logits, not every row's) gives exactly those rows of the whole forward's
// logits, in the order asked, and no row when none is asked. (Bit for bit because both
// products, 10 rows and 3, run the batch-invariant decode kernel; past its row limit the
// whole forward's head runs on the GEMM and equals the chosen rows to round-off.)
TEST(Transformer, IncrementalLogitRowsAreThoseRowsOfTheWholeLogits) {
  ModelConfig cfg = tiny(true, false, false);
  Transformer m(cfg, 6, at::kCPU);
  at::NoGradGuard no_grad;
  const at::Tensor a = random_tokens(12, cfg.vocab_size, 4), b = random_tokens(9, cfg.vocab_size, 5);
  const at::Tensor slots_a = at::arange(0, 12, at::kLong), slots_b = at::arange(20, 29, at::kLong);
  auto run = [&](const at::Tensor& rows) {
    KvCache cache = KvCache::allocate(cfg, 32, at::TensorOptions().dtype(at::kFloat));
    m.forward_incremental(a.narrow(0, 0, 8), {{0, 8, slots_a.narrow(0, 0, 8)}}, cache);
    return m.forward_incremental(at::cat({a.narrow(0, 8, 1), b}), {{8, 1, slots_a.narrow(0, 0, 9)}, {0, 9, slots_b}},
                                 cache, nullptr, nullptr, true, rows);  // [10, V] or [R, V]
  };
  const at::Tensor all = run({});
  ASSERT_EQ(all.size(0), 10);
  const at::Tensor rows = at::tensor(std::vector<int64_t>{9, 0, 4}, at::kLong);
  const at::Tensor some = run(rows);
  ASSERT_EQ(some.sizes(), (std::vector<int64_t>{3, cfg.vocab_size}));
  EXPECT_TRUE(at::equal(some, all.index_select(0, rows)));
  EXPECT_EQ(run(at::empty({0}, at::kLong)).size(0), 0);
}

// An e4m3 KV cache (rollout.kv_cache_dtype = "fp8_e4m3"): every way decode rows read the
// cache gives the same logits (they all read the same de-quantised keys), and those are
// close to the full forward's (e4m3's rounding of K and V is the only change).
TEST(Transformer, Fp8KvCacheEveryDecodePathAgrees) {
  ModelConfig cfg = tiny(true, false, false);
  Transformer m(cfg, 6, at::kCPU);
  at::NoGradGuard no_grad;
  const at::Tensor a = random_tokens(12, cfg.vocab_size, 4), b = random_tokens(9, cfg.vocab_size, 5);
  const at::Tensor full_a = m.forward_packed(a, {12}), full_b = m.forward_packed(b, {9});
  const at::Tensor slots_a = at::arange(0, 24, 2, at::kLong), slots_b = at::arange(30, 39, at::kLong);
  using Mode = Transformer::DecodeAttention;
  std::vector<at::Tensor> results;
  for (Mode mode : {Mode::Auto, Mode::Paged, Mode::Gather, Mode::FreshGather}) {
    SCOPED_TRACE("mode " + std::to_string(int(mode)));
    m.set_decode_attention(mode);
    KvCache cache = KvCache::allocate(cfg, 48, at::TensorOptions().dtype(at::kFloat8_e4m3fn));
    ASSERT_TRUE(cache.quantized());
    m.forward_incremental(a.narrow(0, 0, 8), {{0, 8, slots_a.narrow(0, 0, 8)}}, cache);
    const at::Tensor logits = m.forward_incremental(at::cat({a.narrow(0, 8, 1), b}),
                                                    {{8, 1, slots_a.narrow(0, 0, 9)}, {0, 9, slots_b}}, cache);
    const double gap = std::max((logits[0] - full_a[8]).abs().max().item<double>(),
                                (logits.narrow(0, 1, 9) - full_b).abs().max().item<double>());
    EXPECT_GT(gap, 0.0);
    EXPECT_LT(gap, 0.5) << "e4m3 K/V moved the logits by " << gap;  // measured 0.19 on this peaky random model
    results.push_back(logits);
  }
  for (size_t i = 1; i < results.size(); ++i)
    EXPECT_TRUE(at::allclose(results[i], results[0], 1e-5, 1e-5)) << (results[i] - results[0]).abs().max().item<float>();
}

TEST(Transformer, Bf16TrainingGradientsAreFp32OnTheMasters) {
  ModelConfig cfg = tiny(true, false, false);
  Transformer m(cfg, 5, at::kCPU);
  const at::Tensor tokens = random_tokens(30, cfg.vocab_size, 4);
  at::Tensor loss;
  {
    ForwardPrecision bf16(Precision::BF16, at::kCPU);
    loss = at::log_softmax(m.forward_packed(tokens, {30}), 1).select(1, 2).mean();
  }
  loss.backward();
  for (const auto& p : m.parameters()) {
    ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
    EXPECT_EQ(p.tensor.grad().scalar_type(), at::kFloat) << p.name;
    EXPECT_GT(p.tensor.grad().abs().sum().item<double>(), 0.0) << p.name;
  }
}

// Hugging Face export round trip: safetensors written from one model and loaded into
// another (different seed) give the same logits bit for bit, for both a directory and
// a file path, tied and untied heads; a bf16 tensor survives; a wrong shape is refused.
TEST(HuggingFaceExport, SafetensorsRoundTripGivesIdenticalLogits) {
  const std::string dir = ::testing::TempDir() + "slimpi_hf_roundtrip";
  std::filesystem::create_directories(dir);
  for (bool tied : {false, true}) {
    ModelConfig cfg = tiny(true, !tied, tied);
    Transformer a(cfg, 11, at::kCPU), b(cfg, 12, at::kCPU);
    write_safetensors(dir + "/model.safetensors", a.parameters());
    at::Tensor tokens = random_tokens(20, cfg.vocab_size, 3);
    at::NoGradGuard no_grad;
    EXPECT_FALSE(at::equal(a.forward_packed(tokens, {20}), b.forward_packed(tokens, {20})));
    load_model_weights(b.parameters(), dir);
    EXPECT_TRUE(at::equal(a.forward_packed(tokens, {20}), b.forward_packed(tokens, {20})));
    Transformer c(cfg, 13, at::kCPU);
    load_model_weights(c.parameters(), dir + "/model.safetensors");
    EXPECT_TRUE(at::equal(a.forward_packed(tokens, {20}), c.forward_packed(tokens, {20})));
  }
  at::Tensor bf = at::randn({3, 5}).to(at::kBFloat16);
  write_safetensors(dir + "/bf16.safetensors", {{"x", bf}}, {{"format", "pt"}});
  std::vector<NamedTensor> back = read_safetensors(dir + "/bf16.safetensors");
  ASSERT_EQ(back.size(), 1u);
  EXPECT_TRUE(at::equal(back[0].tensor, bf));
  Transformer wide(tiny(false, false, false), 1, at::kCPU);
  ModelConfig other = tiny(false, false, false);
  other.hidden_size = 64;
  Transformer narrow_model(other, 1, at::kCPU);
  write_safetensors(dir + "/model.safetensors", wide.parameters());
  EXPECT_THROW(load_model_weights(narrow_model.parameters(), dir), Error);
  std::filesystem::remove_all(dir);
}

TEST(LogProbs, MatchANaiveReferenceOnSmallLogits) {
  // 2 sequences: lengths 4 (prompt 2) and 3 (prompt 1) -> 2 + 2 response tokens.
  at::Tensor tokens = at::tensor(std::vector<int64_t>{3, 1, 4, 0, 2, 2, 1}, at::kLong);
  at::Generator g = at::detail::createCPUGenerator(3);
  at::Tensor logits = at::randn({7, 5}, g, at::kFloat) * 3;
  ScoredPositions pos = response_positions(tokens, {4, 3}, {2, 1});
  EXPECT_TRUE(at::equal(pos.logit_rows, at::tensor(std::vector<int64_t>{1, 2, 4, 5}, at::kLong)));
  EXPECT_TRUE(at::equal(pos.targets, at::tensor(std::vector<int64_t>{4, 0, 2, 1}, at::kLong)));
  const double temperature = 0.7;
  TokenLogProbs lp = score_tokens(logits, pos, temperature, true);
  std::vector<int64_t> rows{1, 2, 4, 5}, targets{4, 0, 2, 1};
  for (size_t i = 0; i < rows.size(); ++i) {
    // naive: log(exp(z_t) / sum exp(z)), entropy -sum p log p, in double
    double denom = 0, ent = 0;
    for (int v = 0; v < 5; ++v) denom += std::exp(logits[rows[i]][v].item<double>() / temperature);
    for (int v = 0; v < 5; ++v) {
      double p = std::exp(logits[rows[i]][v].item<double>() / temperature) / denom;
      ent -= p * std::log(p);
    }
    double logp = logits[rows[i]][targets[i]].item<double>() / temperature - std::log(denom);
    EXPECT_NEAR(lp.logp[i].item<double>(), logp, 1e-6);
    EXPECT_NEAR(lp.entropy[i].item<double>(), ent, 1e-6);
  }
}

}  // namespace
}  // namespace slimpi
