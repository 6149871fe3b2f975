// Exact on-policy mode (train.on_policy = "exact", docs/exact_on_policy.md): the
// batch-invariant kernels give a row the same bits whatever shares its call, and so the
// trainer's log-prob of every sampled token (its loss's forward, autograd on) equals the
// engine's bit for bit: dense and MoE models, latent attention, Gated DeltaNet, fp32 and
// bf16 forwards, the prefix cache, chunked prefill, preemption, top-k / top-p,
// speculative decoding's verify pass. The kernels agree with ATen to fp32 round-off, and
// training's gradients are ATen's.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "kernels/batch_invariant.h"
#include "kernels/counter_rng.h"
#include "kernels/small_batch_linear.h"
#include "model/attention.h"
#include "model/exact_ops.h"
#include "model/gated_delta_rule.h"
#include "model/precision.h"
#include "rollout/engine.h"
#include "tokenizer/byte_tokenizer.h"
#include "train/packed_batch.h"
#include "../../support/tiny_model.h"

namespace slimpi {
namespace {

// Exact numerics on for a test's lifetime (the switch is process-wide).
struct ExactNumerics {
  ExactNumerics() { set_exact_numerics(true); }
  ~ExactNumerics() { set_exact_numerics(false); }
};

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.contiguous(), y = b.contiguous();
  return x.sizes() == y.sizes() && x.scalar_type() == y.scalar_type() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), size_t(x.numel()) * x.element_size()) == 0;
}

// --- the kernels ---

// Row r of `rows` computed alone, and among `n` rows (the others random), at every
// position 0, n/2 and n-1: the same bits.
using RowKernel = std::function<at::Tensor(const at::Tensor& rows)>;  // [R, ...] -> [R, ...]
void expect_rows_invariant(const RowKernel& kernel, const at::Tensor& row, const char* what) {
  const at::Tensor alone = kernel(row.unsqueeze(0))[0];
  for (int64_t n : {7, 64, 300}) {
    std::vector<int64_t> shape{n};
    for (int64_t d : row.sizes()) shape.push_back(d);
    at::Tensor batch = at::randn(shape, row.options());
    for (int64_t at_row : {int64_t(0), n / 2, n - 1}) {
      batch[at_row].copy_(row);
      EXPECT_TRUE(same_bits(kernel(batch)[at_row], alone)) << what << ": row " << at_row << " of " << n;
    }
  }
}

TEST(BatchInvariantKernels, ARowIsTheSameBitsAloneAndAmongOthers) {
  at::manual_seed(3);
  const at::Tensor w = at::randn({96, 80}), norm_w = at::randn({80}), bias = at::randn({96});
  expect_rows_invariant([&](const at::Tensor& x) { return batch_invariant_linear(x, w, bias); }, at::randn({80}),
                        "linear");
  const at::Tensor wide = at::randn({40, 600});  // K >= kBatchInvariantWideK: 16 lanes
  expect_rows_invariant([&](const at::Tensor& x) { return batch_invariant_linear(x, wide); }, at::randn({600}),
                        "linear (16 lanes)");
  expect_rows_invariant([&](const at::Tensor& x) { return rms_norm_rows(x, norm_w, 1e-6); }, at::randn({80}),
                        "rms_norm");
  expect_rows_invariant([&](const at::Tensor& x) { return softmax_rows(x); }, at::randn({80}) * 4, "softmax");
  expect_rows_invariant([&](const at::Tensor& x) { return silu_mul_elementwise(x, x.flip(-1)); }, at::randn({80}) * 4,
                        "silu_mul");
  expect_rows_invariant([&](const at::Tensor& x) { return sigmoid_elementwise(x); }, at::randn({33}) * 6, "sigmoid");
  expect_rows_invariant([&](const at::Tensor& x) { return silu_elementwise(x); }, at::randn({33}) * 6, "silu");
  expect_rows_invariant([&](const at::Tensor& x) { return softplus_elementwise(x); }, at::randn({33}) * 12, "softplus");
  expect_rows_invariant([&](const at::Tensor& x) { return l2_normalize_rows(x, 1e-6); }, at::randn({80}), "l2norm");
  // Log-probs: each row's temperature, target and support are its own.
  expect_rows_invariant(
      [&](const at::Tensor& z) {
        const int64_t R = z.size(0);
        return token_log_probs_rows(z, at::full({R}, 0.7f), at::full({R}, 5, at::kLong), at::full({R}, 13, at::kLong))
            .unsqueeze(1);
      },
      at::randn({1000}) * 3, "token_log_probs");
  // Attention: query rows of one sequence of 40 keys, each seeing its own prefix.
  const at::Tensor k = at::randn({40, 2, 16}), v = at::randn({40, 2, 16});
  const at::Tensor slots = at::arange(40, at::kLong).unsqueeze(0);
  expect_rows_invariant(
      [&](const at::Tensor& q) {
        const int64_t R = q.size(0);
        return attention_rows(q, k, v, slots, at::zeros({R}, at::kLong), at::full({R}, 29, at::kLong));
      },
      at::randn({4, 16}), "attention");
}

// The product's 16 lanes are one register on x86-64-v4 and two halves on -v3: the same
// operations, the same bits (K = 200: 8 lanes and a tail of 0; K = 520: 16 lanes and a
// tail of 8).
TEST(BatchInvariantKernels, ProductIsTheSameBitsOnX86_64V3AndV4) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("x86-64-v4")) GTEST_SKIP() << "this CPU has no x86-64-v4";
  at::manual_seed(5);
  for (int64_t K : {200, 520})
    for (int64_t M : {1, 5, 8, 70}) {
      const at::Tensor x = at::randn({M, K}), w = at::randn({37, K});
      EXPECT_TRUE(same_bits(batch_invariant_linear(x, w, {}, SmallBatchLinearCode::X86_64_V4),
                            batch_invariant_linear(x, w, {}, SmallBatchLinearCode::X86_64_V3)))
          << M << " rows of " << K;
    }
}

// bf16 weights are widened in registers: the bits of the fp32 kernel over the widened
// weights at 16 lanes (the wide kernel, K >= kBatchInvariantWideK), for any K (a tail of
// 0..15), any rows, on every x86-64 level this CPU has; a row's bits do not depend on the
// batch; exact_dense's bf16 product is autocast's linear to bf16 round-off.
TEST(BatchInvariantKernels, Bf16WeightsAreTheWidenedWeightsProduct) {
  __builtin_cpu_init();
  at::manual_seed(6);
  const int level = exact_kernel_level();
  for (int64_t K : {520, 531, 1024})
    for (int64_t M : {1, 5, 8, 70}) {
      const at::Tensor x = at::randn({M, K}), w = at::randn({29, K}).to(at::kBFloat16);
      const at::Tensor y = batch_invariant_linear(x, w);
      EXPECT_TRUE(same_bits(y, batch_invariant_linear(x, w.to(at::kFloat)))) << M << " rows of " << K;
      if (level >= 3)
        EXPECT_TRUE(same_bits(y, batch_invariant_linear(x, w, {}, SmallBatchLinearCode::X86_64_V3)))
            << M << " rows of " << K << " on -v3";
    }
  // Short weights: the bf16 kernel keeps 16 lanes where fp32 ones take 8.
  const at::Tensor narrow = at::randn({40, 80}).to(at::kBFloat16);
  expect_rows_invariant([&](const at::Tensor& x) { return batch_invariant_linear(x, narrow); }, at::randn({80}),
                        "linear (bf16 weights)");
  const at::Tensor x = at::randn({33, 80}), bias = at::randn({40});
  const at::Tensor mine = exact_dense(x, narrow.to(at::kFloat), bias, /*bf16=*/true);
  EXPECT_EQ(mine.scalar_type(), at::kBFloat16);
  const at::Tensor theirs = at::linear(x.to(at::kBFloat16), narrow, bias.to(at::kBFloat16));
  // Both round an fp32 sum of bf16 products to bf16: one bf16 ulp (2^-8 relative) apart at most.
  EXPECT_TRUE(at::allclose(mine.to(at::kFloat), theirs.to(at::kFloat), 1.0 / 128, 1e-2));
}

TEST(BatchInvariantKernels, AgreeWithAtenToRoundOff) {
  at::manual_seed(4);
  const at::Tensor x = at::randn({37, 80}) * 3, w = at::randn({80});
  // Each kernel's round-off: a few fp32 ulps of its O(1) results (exp_fixed's ~1e-7
  // relative, sums of <= 1000 terms in fp64 or 16 fp32 lanes).
  EXPECT_TRUE(at::allclose(rms_norm_rows(x, w, 1e-6), at::rsqrt(x.pow(2).mean(-1, true) + 1e-6) * x * w, 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(softmax_rows(x), at::softmax(x, -1), 1e-5, 1e-7));
  EXPECT_TRUE(at::allclose(silu_mul_elementwise(x, x.cos()), at::silu(x) * x.cos(), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(sigmoid_elementwise(x * 10), at::sigmoid(x * 10), 1e-5, 1e-7));
  EXPECT_TRUE(at::allclose(silu_elementwise(x * 10), at::silu(x * 10), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(softplus_elementwise(x * 10), at::softplus(x * 10), 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(l2_normalize_rows(x, 1e-6), x * at::rsqrt(x.pow(2).sum(-1, true) + 1e-6), 1e-6, 1e-7));
  const at::Tensor W = at::randn({50, 80});
  EXPECT_TRUE(at::allclose(batch_invariant_linear(x, W), at::linear(x, W), 1e-5, 1e-4));
  const at::Tensor z = at::randn({6, 1000}) * 4, targets = at::tensor({0, 5, 999, 17, 3, 500}, at::kLong);
  const at::Tensor support = at::tensor({0, 0, 7, 1000, 1, 64}, at::kLong);
  const at::Tensor t = at::tensor({1.0f, 0.5f, 1.3f, 1.0f, 1.0f, 0.9f});
  EXPECT_TRUE(at::allclose(token_log_probs_rows(z, t, targets, support),
                           log_probs_over_support(z / t.unsqueeze(1), targets, support), 1e-5, 1e-5));
  // Attention against the padded ATen path, grouped-query, sequences of 1, 9 and 33.
  const std::vector<int64_t> lens{9, 1, 33};
  const int64_t T = 43;
  const at::Tensor q = at::randn({T, 4, 16}), k = at::randn({T, 2, 16}), v = at::randn({T, 2, 16});
  const AttentionLayout layout = packed_layout(lens, at::kCPU);
  const AttentionPlan plan{int64_t(1) << 40, DecodeAttention::Gather};
  const at::Tensor reference = attend(q, k, v, layout, nullptr, 0, plan);
  const ExactNumerics exact;
  EXPECT_TRUE(at::allclose(attend(q, k, v, layout, nullptr, 0, plan), reference, 1e-5, 1e-6));
}

// The gated delta rule token by token: the recurrent form's numbers to fp32 round-off
// (an fp64 reference), and a sequence's outputs and final state the same bits whether it
// runs in one pass, in pieces (prefill chunks, then decode steps, the state carried), or
// beside other sequences.
TEST(BatchInvariantKernels, GatedDeltaRuleTokenByToken) {
  at::manual_seed(7);
  const int64_t B = 3, L = 21, H = 2, Dk = 8, Dv = 6;
  const at::Tensor k_raw = at::randn({B, L, H, Dk});
  const at::Tensor q = at::randn({B, L, H, Dk}) * 0.3, k = k_raw * at::rsqrt(k_raw.pow(2).sum(-1, true));  // unit keys
  const at::Tensor v = at::randn({B, L, H, Dv}), g = -at::rand({B, L, H}), beta = at::rand({B, L, H});
  at::Tensor last, ref_last;
  const at::Tensor o = gated_delta_rule_rows(q, k, v, g, beta, {}, &last);
  const at::Tensor ref = gated_delta_rule_recurrent(q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble),
                                                    g.to(at::kDouble), beta.to(at::kDouble), {}, &ref_last);
  // Each output sums Dk = 8 products of O(1) terms over a state of 21 O(1) updates: a few
  // fp32 ulps (1e-7 relative) of O(1) values, with room.
  EXPECT_TRUE(at::allclose(o.to(at::kDouble), ref, 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(last.to(at::kDouble), ref_last, 1e-5, 1e-5));
  // Sequence 1 alone, in pieces of 5, 1 and 15 tokens.
  auto seq = [&](const at::Tensor& x, int64_t from, int64_t n) { return x.narrow(0, 1, 1).narrow(1, from, n); };
  at::Tensor state;
  std::vector<at::Tensor> pieces;
  int64_t from = 0;
  for (int64_t n : {5, 1, 15}) {
    at::Tensor next;
    pieces.push_back(gated_delta_rule_rows(seq(q, from, n), seq(k, from, n), seq(v, from, n), seq(g, from, n),
                                           seq(beta, from, n), state, &next));
    state = next;
    from += n;
  }
  EXPECT_TRUE(same_bits(at::cat(pieces, 1), o.narrow(0, 1, 1)));
  EXPECT_TRUE(same_bits(state, last.narrow(0, 1, 1)));
}

// A diverged model's NaN reaches the log-prob (and so the loss's non-finite check), and
// masked logits (−inf) weigh nothing.
TEST(BatchInvariantKernels, NanPropagatesAndMinusInfinityWeighsNothing) {
  at::Tensor z = at::randn({2, 50});
  z[0][7] = std::numeric_limits<float>::quiet_NaN();
  z[1][9] = -std::numeric_limits<float>::infinity();
  const at::Tensor logp = token_log_probs_rows(z, at::ones({2}), at::tensor({3, 4}, at::kLong), {});
  EXPECT_TRUE(std::isnan(logp[0].item<float>()));
  const at::Tensor finite = at::cat({z[1].narrow(0, 0, 9), z[1].narrow(0, 10, 40)});
  EXPECT_NEAR(logp[1].item<float>(), at::log_softmax(finite, 0)[4].item<float>(), 1e-6);
  EXPECT_TRUE(std::isnan(softmax_rows(z)[0][0].item<float>()));
  EXPECT_TRUE(std::isnan(rms_norm_rows(z, at::ones({50}), 1e-6)[0][0].item<float>()));
}

// --- the model and the engine ---

ModelConfig dense_model() { return testing::tiny_model_config(96, 0.2); }

ModelConfig moe_model(bool deepseek) {
  ModelConfig c = testing::tiny_model_config(96, 0.2);
  c.n_experts = 4;
  c.n_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.norm_topk_prob = true;
  if (deepseek) testing::use_deepseek_moe(c, /*n_group=*/2, /*topk_group=*/1, /*first_k_dense=*/1);
  return c;
}

std::vector<GenerationRequest> requests(int n_groups, int64_t n_samples, double temperature, int64_t top_k,
                                        double top_p) {
  std::vector<GenerationRequest> out;
  for (int g = 0; g < n_groups; ++g) {
    GenerationRequest r;
    r.group_index = g;
    r.prompt = {ByteTokenizer::kBos};
    for (int64_t i = 0; i < 6; ++i) r.prompt.push_back(60 + i % 13);  // a shared header: prefix hits
    for (int64_t i = 0; i < 4 + (g * 7) % 13; ++i) r.prompt.push_back((g * 31 + i * 7) % 256);
    r.n_samples = n_samples;
    r.params.temperature = temperature;
    r.params.top_k = top_k;
    r.params.top_p = top_p;
    r.params.max_new_tokens = 8 + (g * 5) % 23;
    r.params.stop_token_ids = {ByteTokenizer::kEos};
    r.seed = mix_seed(4321, 0, uint64_t(g));
    out.push_back(r);
  }
  return out;
}

std::vector<Sample> generate(const Transformer& m, const EngineConfig& cfg, const std::vector<GenerationRequest>& reqs,
                             EngineStats* stats) {
  Engine e(cfg, m);
  for (const auto& r : reqs) e.add_request(r);
  std::vector<Sample> out = e.run_to_completion();
  *stats = e.stats();
  return out;
}

// Every response token's log-prob as the trainer's loss computes it (packed micro-batches
// of `per_batch` samples, autograd on, the parameters requiring gradients), against the
// engine's: the count of tokens whose bits differ, and the largest difference.
struct Agreement {
  int64_t tokens = 0, differ = 0;
  double max_gap = 0;
};
Agreement trainer_vs_engine(const Transformer& m, const std::vector<Sample>& samples, double temperature,
                            size_t per_batch, Precision precision = Precision::FP32) {
  Agreement a;
  for (size_t first = 0; first < samples.size(); first += per_batch) {
    std::vector<int64_t> which;
    for (size_t i = first; i < std::min(samples.size(), first + per_batch); ++i) which.push_back(int64_t(i));
    const PackedBatch b = pack(samples, which, at::kCPU);
    const at::Tensor logp = packed_log_probs(m, b, precision, temperature, /*with_entropy=*/true).logp;
    EXPECT_TRUE(logp.requires_grad());
    std::vector<float> engine;
    for (int64_t i : which)
      engine.insert(engine.end(), samples[size_t(i)].rollout_log_probs.begin(), samples[size_t(i)].rollout_log_probs.end());
    const at::Tensor mine = logp.detach().contiguous();
    EXPECT_EQ(mine.numel(), int64_t(engine.size()));
    for (int64_t t = 0; t < std::min<int64_t>(mine.numel(), int64_t(engine.size())); ++t) {
      const float x = mine.data_ptr<float>()[t], y = engine[size_t(t)];
      ++a.tokens;
      if (std::memcmp(&x, &y, sizeof x) != 0) ++a.differ;
      a.max_gap = std::max(a.max_gap, std::abs(double(x) - double(y)));
    }
  }
  return a;
}

// The engine samples with `engine_model`; the trainer scores with `m` in `precision` (a
// bf16 engine's weights are the trainer's fp32 masters rounded, as a weight sync sends them).
void expect_bit_for_bit(const Transformer& m, const Transformer& engine_model, Precision precision,
                        const EngineConfig& cfg, const std::vector<GenerationRequest>& reqs, double temperature,
                        bool expect_preemption) {
  EngineStats stats;
  const std::vector<Sample> out = generate(engine_model, cfg, reqs, &stats);
  if (expect_preemption) EXPECT_GT(stats.preemptions, 0);
  EXPECT_GT(stats.prefix_hit_tokens, 0);
  for (size_t per_batch : {size_t(1), size_t(5), out.size()}) {
    const Agreement a = trainer_vs_engine(m, out, temperature, per_batch, precision);
    EXPECT_GT(a.tokens, 200);
    EXPECT_EQ(a.differ, 0) << a.differ << " of " << a.tokens << " tokens differ (largest gap " << a.max_gap
                           << ") with micro-batches of " << per_batch << " samples";
  }
}
void expect_bit_for_bit(const Transformer& m, const EngineConfig& cfg, const std::vector<GenerationRequest>& reqs,
                        double temperature, bool expect_preemption) {
  expect_bit_for_bit(m, m, Precision::FP32, cfg, reqs, temperature, expect_preemption);
}

// Preemption (96 cache tokens for 32 running sequences), prefix hits (the shared header),
// chunked prefill (64 tokens a forward): every composition of batch the engine makes.
EngineConfig tight_engine() { return EngineConfig{4, 4 * 24, 32, 64, true}; }

TEST(ExactOnPolicy, DenseModelTrainerLogProbsAreTheEnginesBitForBit) {
  const ExactNumerics exact;
  const Transformer m(dense_model(), 7, at::kCPU);
  expect_bit_for_bit(m, tight_engine(), requests(8, 3, 0.8, 0, 1.0), 0.8, true);
}

TEST(ExactOnPolicy, TopKAndTopPSupportsToo) {
  const ExactNumerics exact;
  const Transformer m(dense_model(), 8, at::kCPU);
  expect_bit_for_bit(m, tight_engine(), requests(6, 3, 1.0, 20, 0.9), 1.0, true);
}

TEST(ExactOnPolicy, MixtureOfExpertsRoutingIncluded) {
  const ExactNumerics exact;
  for (bool deepseek : {false, true}) {
    const Transformer m(moe_model(deepseek), 9, at::kCPU);
    expect_bit_for_bit(m, tight_engine(), requests(6, 3, 0.9, 0, 1.0), 0.9, true);
  }
}

// A width where the products take 16 lanes (K = 512: kBatchInvariantWideK) and MKL's
// GEMM would block rows differently: DeepSeekMoE routing (the sigmoid router's product).
TEST(ExactOnPolicy, WideModelWithDeepSeekMoeRouting) {
  const ExactNumerics exact;
  ModelConfig c = moe_model(/*deepseek=*/true);
  c.hidden_size = 512;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.intermediate_size = 128;
  c.moe_intermediate_size = 64;
  c.init_std = 0.05;
  const Transformer m(c, 13, at::kCPU);
  expect_bit_for_bit(m, tight_engine(), requests(6, 3, 1.0, 0, 1.0), 1.0, true);
}

TEST(ExactOnPolicy, SpeculativeDecodingsVerifyPassToo) {
  const ExactNumerics exact;
  ModelConfig c = dense_model();
  c.mtp_num_layers = 1;
  const Transformer m(c, 10, at::kCPU);
  EngineConfig cfg{4, 8192, 16, 512, true};
  cfg.spec_steps = 2;
  EngineStats stats;
  const std::vector<Sample> out = generate(m, cfg, requests(6, 3, 1.0, 0, 1.0), &stats);
  EXPECT_GT(stats.spec_accepted, 0);
  const Agreement a = trainer_vs_engine(m, out, 1.0, 4);
  EXPECT_GT(a.tokens, 200);
  EXPECT_EQ(a.differ, 0) << a.differ << " of " << a.tokens << " tokens differ (largest gap " << a.max_gap << ")";
}

// A bf16 or e4m3 KV cache under fp32 engines: the trainer's attention reads its keys and
// values rounded as the cache holds them.
TEST(ExactOnPolicy, Bf16AndE4m3KvCaches) {
  const ExactNumerics exact;
  const Transformer m(dense_model(), 14, at::kCPU);
  for (at::ScalarType storage : {at::kBFloat16, at::kFloat8_e4m3fn}) {
    set_exact_kv_storage(storage);
    EngineConfig cfg = tight_engine();
    cfg.kv_cache_dtype = storage;
    expect_bit_for_bit(m, cfg, requests(6, 3, 0.9, 0, 1.0), 0.9, true);
  }
  set_exact_kv_storage(at::kFloat);
}

// bf16 forwards (train.precision = rollout.precision = "bf16"): the engine holds bf16
// weights (the masters' roundings) and a bf16 KV cache; the trainer runs its fp32 masters
// through the bf16 forward. Dense and DeepSeekMoE, top-k / top-p, the verify pass.
TEST(ExactOnPolicy, Bf16ForwardsToo) {
  const ExactNumerics exact;
  set_exact_kv_storage(at::kBFloat16);
  EngineConfig cfg = tight_engine();
  cfg.kv_cache_dtype = at::kBFloat16;
  for (const ModelConfig& c : {dense_model(), moe_model(/*deepseek=*/true)}) {
    const Transformer masters(c, 15, at::kCPU), engine_weights(c, 15, at::kCPU, at::kBFloat16);
    expect_bit_for_bit(masters, engine_weights, Precision::BF16, cfg, requests(6, 3, 0.9, 0, 1.0), 0.9, true);
    expect_bit_for_bit(masters, engine_weights, Precision::BF16, cfg, requests(6, 3, 1.0, 20, 0.9), 1.0, true);
  }
  ModelConfig c = dense_model();
  c.mtp_num_layers = 1;
  const Transformer masters(c, 16, at::kCPU), engine_weights(c, 16, at::kCPU, at::kBFloat16);
  EngineConfig spec{4, 8192, 16, 512, true};
  spec.spec_steps = 2;
  spec.kv_cache_dtype = at::kBFloat16;
  EngineStats stats;
  const std::vector<Sample> out = generate(engine_weights, spec, requests(6, 3, 1.0, 0, 1.0), &stats);
  EXPECT_GT(stats.spec_accepted, 0);
  const Agreement a = trainer_vs_engine(masters, out, 1.0, 4, Precision::BF16);
  EXPECT_GT(a.tokens, 200);
  EXPECT_EQ(a.differ, 0) << a.differ << " of " << a.tokens << " tokens differ (largest gap " << a.max_gap << ")";
  set_exact_kv_storage(at::kFloat);
}

// Multi-head latent attention (DeepSeek-V3): the engine caches the latent and attends in
// the absorbed form; under the mode the trainer does too. fp32 and bf16, the e4m3 cache.
TEST(ExactOnPolicy, LatentAttentionToo) {
  const ExactNumerics exact;
  ModelConfig c = moe_model(/*deepseek=*/true);
  testing::use_latent_attention(c);
  const Transformer masters(c, 17, at::kCPU), engine_weights(c, 17, at::kCPU, at::kBFloat16);
  expect_bit_for_bit(masters, tight_engine(), requests(6, 3, 0.9, 20, 0.95), 0.9, true);
  for (at::ScalarType storage : {at::kBFloat16, at::kFloat8_e4m3fn}) {
    set_exact_kv_storage(storage);
    EngineConfig cfg = tight_engine();
    cfg.kv_cache_dtype = storage;
    expect_bit_for_bit(masters, engine_weights, Precision::BF16, cfg, requests(6, 3, 0.9, 0, 1.0), 0.9, true);
  }
  set_exact_kv_storage(at::kFloat);
}

// Gated DeltaNet (Qwen3.5's hybrid layers): the engine prefills in chunks (3-token
// prefill chunks here) and decodes a token at a time, the trainer passes over whole
// sequences; under the mode both run the rule token by token. Preemption recomputes from
// the tokens (a hybrid engine has no prefix cache). fp32 and bf16.
TEST(ExactOnPolicy, GatedDeltaNetToo) {
  const ExactNumerics exact;
  ModelConfig c = dense_model();
  testing::use_gated_delta_net(c);
  EngineConfig cfg{4, 4 * 32, 8, 256, /*prefix_cache=*/false};
  cfg.chunked_prefill_tokens = 3;
  for (const Precision precision : {Precision::FP32, Precision::BF16}) {
    set_exact_kv_storage(weight_dtype(precision));
    const Transformer masters(c, 18, at::kCPU), engine_weights(c, 18, at::kCPU, weight_dtype(precision));
    EngineStats stats;
    const std::vector<Sample> out = generate(engine_weights, cfg, requests(6, 3, 0.9, 0, 1.0), &stats);
    EXPECT_GT(stats.preemptions, 0);
    for (size_t per_batch : {size_t(1), size_t(5), out.size()}) {
      const Agreement a = trainer_vs_engine(masters, out, 0.9, per_batch, precision);
      EXPECT_GT(a.tokens, 200);
      EXPECT_EQ(a.differ, 0) << a.differ << " of " << a.tokens << " tokens differ (largest gap " << a.max_gap << ") in "
                             << precision_name(precision) << " with micro-batches of " << per_batch;
    }
  }
  set_exact_kv_storage(at::kFloat);
}

// Without the mode the same engine and trainer differ in the last bits: what the mode fixes.
TEST(ExactOnPolicy, WithoutTheModeTheBitsDiffer) {
  const Transformer m(dense_model(), 7, at::kCPU);
  EngineStats stats;
  const std::vector<Sample> out = generate(m, tight_engine(), requests(8, 3, 0.8, 0, 1.0), &stats);
  const Agreement a = trainer_vs_engine(m, out, 0.8, out.size());
  EXPECT_GT(a.differ, 0);
  EXPECT_LT(a.max_gap, 1e-5);
}

// A prompt's logits rows alone and packed among 1, 6 and 63 other sequences: the same bits.
TEST(ExactOnPolicy, LogitsRowsDoNotDependOnTheBatch) {
  const ExactNumerics exact;
  at::NoGradGuard no_grad;
  const Transformer m(moe_model(false), 11, at::kCPU);
  const at::Tensor prompt = at::randint(0, 256, {23}, at::kLong);
  const at::Tensor alone = m.forward_packed(prompt, {23});
  for (int64_t others : {1, 6, 63}) {
    std::vector<at::Tensor> parts;
    std::vector<int64_t> lens;
    int64_t start = 0, total = 0;
    for (int64_t i = 0; i < others; ++i) {
      if (i == others / 2) {
        start = total;
        parts.push_back(prompt);
        lens.push_back(23);
        total += 23;
      }
      lens.push_back(3 + (i * 5) % 40);
      parts.push_back(at::randint(0, 256, {lens.back()}, at::kLong));
      total += lens.back();
    }
    const at::Tensor logits = m.forward_packed(at::cat(parts), lens);
    EXPECT_TRUE(same_bits(logits.narrow(0, start, 23), alone)) << "among " << others << " others";
  }
}

// Training under the mode: the kernels give the values, ATen's formulas the gradients,
// and both are the default mode's to round-off (so the mode computes the same function:
// a wrong exact forward, such as a tap order or a head's weight slice, fails here).
// fp32: log-probs of O(5) to 1e-5 (Gated DeltaNet: 1.5e-4, below) and gradients to 1e-4
// of their largest entry, a few fp32 ulps each with room. Latent attention takes the absorbed form in the mode and the
// expanded one by default; Gated DeltaNet the rule token by token against the chunked
// form. A bf16 forward (dense model): the two modes' activations are bf16 roundings of
// sums taken in other orders, an ulp (2^-8) apart here and there, and the gradients
// move by a few of those ulps (0.032 of the largest entry at most on a Xeon); 0.1 bounds
// that and still fails a missing or doubled term (O(1)). MoE models are left out in bf16:
// an ulp in the router's input can flip a token's expert, which changes gradients by
// O(1), as it should.
TEST(ExactOnPolicy, GradientsAreTheDefaultModesToRoundOff) {
  ModelConfig mla = moe_model(true), hybrid = dense_model();
  testing::use_latent_attention(mla);
  testing::use_gated_delta_net(hybrid);
  const std::vector<std::pair<const char*, ModelConfig>> models{
      {"dense", dense_model()}, {"moe", moe_model(true)}, {"mla", mla}, {"gated deltanet", hybrid}};
  for (const Precision precision : {Precision::FP32, Precision::BF16})
    for (const auto& [name, c] : models) {
      if (precision == Precision::BF16 && std::string(name) != "dense") continue;
      std::vector<at::Tensor> grads[2];
      at::Tensor logps[2];
      for (int exact_mode = 0; exact_mode < 2; ++exact_mode) {
        set_exact_numerics(exact_mode == 1);
        const Transformer m(c, 12, at::kCPU);
        const at::Tensor tokens = at::arange(40, at::kLong) * 7 % 256;
        Sample s;
        s.tokens.assign(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + 40);
        s.prompt_length = 10;
        Sample s2 = s;
        s2.tokens.resize(25);
        const PackedBatch b = pack({s, s2}, {0, 1}, at::kCPU);
        const at::Tensor logp = packed_log_probs(m, b, precision, 0.9, false).logp;
        logp.sum().backward();
        logps[exact_mode] = logp.detach();
        for (const auto& p : m.parameters())  // (undefined: a parameter the forward did not use)
          grads[exact_mode].push_back(p.tensor.grad().defined() ? p.tensor.grad().clone() : at::zeros_like(p.tensor));
      }
      set_exact_numerics(false);
      // fp32 log-probs of O(5): 1e-5 is some 20 ulps. Gated DeltaNet's chunked rule (the
      // default) and its token-by-token rule (the mode) add each token's update to the state
      // in other orders, an error that grows with the tokens the state has absorbed: up to
      // 40 here, a few ulps each, so 40 x 4 ulps of 8 (1.5e-4) bounds it (1.1e-5 measured
      // on an AMD EPYC); a wrong tap or a missing term (0.1 and more) still fails.
      const double logp_tolerance = std::string(name) == "gated deltanet" ? 40 * 4 * 9.5367e-7 : 1e-5;
      if (precision == Precision::FP32)
        EXPECT_LE((logps[0] - logps[1]).abs().max().item<double>(), logp_tolerance) << name;
      ASSERT_EQ(grads[0].size(), grads[1].size());
      const double tolerance = precision == Precision::BF16 ? 0.1 : 1e-4;
      for (size_t i = 0; i < grads[0].size(); ++i) {
        const double scale = grads[0][i].abs().max().item<double>();
        const double gap = (grads[0][i] - grads[1][i]).abs().max().item<double>();
        EXPECT_LE(gap, tolerance * scale + 1e-7) << name << " parameter " << i << " in " << precision_name(precision);
      }
    }
}

}  // namespace
}  // namespace slimpi
