// The rollout engine against the bounds named in the Rollout-engine issue, same run:
//   BM_KvCacheVsRecompute  64 sequences x 128 new tokens, greedy, on the quickstart-size
//                          model (0.86M): the engine (paged KV cache) against a loop that
//                          recomputes every sequence from scratch for each new token.
//                          Counter kv_over_recompute_speed.
//   BM_DecodeShare/50M     decode iterations with 64 running sequences on a ~50M model:
//                          decode FLOP/s (2 x dense params per token) over the FLOP/s of
//                          torch matmul on the same [64, d] x [d, out] shapes.
//                          Counter decode_share_of_matmul.
//   BM_DecodeBf16VsFp32    decode steps at 64 sequences on the ~50M model, bf16 weights and
//                          KV cache vs fp32, alternating. Counter bf16_over_fp32 (time).
//   BM_DecodeKvE4m3VsBf16  decode steps at 32 sequences of 1024-token prompts on a bf16
//                          quickstart-size model (attention-heavy), an e4m3 KV cache
//                          (rollout.kv_cache_dtype = "fp8_e4m3") vs a bf16 one,
//                          alternating. Counters e4m3_over_bf16 (time), bytes_per_token.
//   BM_DecodeNextToPrefill 32 decode rows at 1024 cached tokens next to a 1024-token
//                          prefill chunk: decode attending apart vs padded to the chunk.
//   BM_DecodeLongContext   one decode forward at 64 sequences x 1024-token contexts, ~50M
//                          model: the paged kernel vs a gather into a reused buffer vs a
//                          fresh padded copy per layer (the code before the kernel), each
//                          as a share of torch matmul on the same shapes.
//   BM_GroupPrefill        32 prompts of 512 tokens x 8 samples, 1 new token each (so the
//                          time is prefill): one group per prompt (the prompt prefilled
//                          once, shared by its 8 samples) vs the same 256 requests as
//                          single samples with the prefix cache off (8 prefills of each
//                          prompt), timed in the same run. Counter unshared_over_shared.
//   BM_SmallBatchLinear/M/N/K  the dense layers of a decode step with M rows: 8 weights of
//                          [N, K] fp32 run in turn (the Qwen3-0.6B MLP's [3072, 1024]:
//                          100 MB, past the caches; the quickstart's [344, 128]: in
//                          cache), kernels/small_batch_linear against at::linear (MKL),
//                          alternating; and the memory bound, a sum over the same
//                          weights. Counters kernel_gb_per_s, mkl_gb_per_s,
//                          bound_gb_per_s (weight bytes a second), kernel_over_mkl (speed).
//   BM_MlaDecodeAbsorbedVsExpanded/B  one decode forward of B = 1, 8, 64 sequences at 1024
//                          cached tokens, DeepSeek-V3's attention shape at reduced width:
//                          the latent cache (absorbed) vs expanded keys and values.
//   BM_HybridDecodeVsQwen3/C  one decode forward of 4 sequences at C = 1k, 8k, 32k cached
//                          tokens: a Qwen3.5-shaped hybrid (6 Gated DeltaNet layers, 2 gated
//                          full-attention ones) against a Qwen3-shaped model of the same
//                          width and depth (8 full-attention layers), alternating. Counters
//                          hybrid_over_qwen3 (speed) and each one's cache bytes a sequence.
//   BM_DeltaRuleChunkedVsRecurrent  the gated delta rule over a 4096-token prefill (16 value
//                          heads of 128 x 128 state, fp32): the chunked form against the
//                          token-by-token recurrence, alternating. Counter
//                          recurrent_over_chunked (time).
// Threads: $SLIMPI_THREADS (default 1). Run: build/perf/bench_engine
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>

#include "alternate.h"
#include "kernels/counter_rng.h"
#include "kernels/small_batch_linear.h"
#include "model/gated_delta_rule.h"
#include "rollout/engine.h"
#include "tokenizer/byte_tokenizer.h"

namespace slimpi::perf {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

ModelConfig quickstart_model() {
  ModelConfig c;
  c.vocab_size = 260, c.hidden_size = 128, c.n_layers = 4, c.n_heads = 4, c.n_kv_heads = 4;
  c.intermediate_size = 344, c.max_seq_len = 512;
  return c;
}

ModelConfig model_50m() {
  ModelConfig c;
  c.vocab_size = 260, c.hidden_size = 640, c.n_layers = 10, c.n_heads = 10, c.n_kv_heads = 10;
  c.intermediate_size = 1728, c.max_seq_len = 512;
  return c;
}

std::vector<GenerationRequest> requests(int n_groups, int64_t n_samples, int64_t prompt_len, int64_t new_tokens,
                                        double temperature) {
  std::vector<GenerationRequest> out;
  for (int g = 0; g < n_groups; ++g) {
    GenerationRequest r;
    r.group_index = g;
    r.prompt.push_back(ByteTokenizer::kBos);
    for (int64_t i = 1; i < prompt_len; ++i) r.prompt.push_back((g * 17 + i * 3) % 256);
    r.n_samples = n_samples;
    r.params.temperature = temperature;
    r.params.max_new_tokens = new_tokens;  // no stop tokens: exactly new_tokens each
    r.seed = mix_seed(1, 0, uint64_t(g));
    out.push_back(r);
  }
  return out;
}

void BM_KvCacheVsRecompute(benchmark::State& state) {
  Transformer m(quickstart_model(), 1, at::kCPU);
  const int64_t n_seq = 64, new_tokens = 128, prompt = 16;
  auto reqs = requests(int(n_seq), 1, prompt, new_tokens, 0.0);
  double engine_s = 0, recompute_s = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    Engine e(EngineConfig{16, 64 * 160, 64, 4096, false}, m);
    for (const auto& r : reqs) e.add_request(r);
    auto out = e.run_to_completion();
    double a = since(t0);
    // The no-cache loop: every step re-runs every sequence in full, one packed forward.
    at::NoGradGuard no_grad;
    t0 = Clock::now();
    std::vector<std::vector<int64_t>> seqs;
    for (const auto& r : reqs) seqs.push_back(r.prompt);
    for (int64_t t = 0; t < new_tokens; ++t) {
      std::vector<int64_t> flat, lens;
      for (const auto& s : seqs) {
        flat.insert(flat.end(), s.begin(), s.end());
        lens.push_back(int64_t(s.size()));
      }
      at::Tensor logits = m.forward_packed(at::tensor(flat, at::kLong), lens);
      int64_t end = 0;
      for (size_t i = 0; i < seqs.size(); ++i) {
        end += lens[i];
        seqs[i].push_back(logits[end - 1].argmax().item<int64_t>());
      }
    }
    double b = since(t0);
    for (size_t i = 0; i < seqs.size(); ++i)  // both loops produced the same greedy tokens
      if (std::vector<int64_t>(seqs[i].begin() + prompt, seqs[i].end()) != out[i].response())
        state.SkipWithError("engine and recompute loop disagree");
    state.SetIterationTime(a);
    engine_s += a;
    recompute_s += b;
  }
  const double tokens = double(n_seq * new_tokens);
  state.counters["engine_tokens_per_s"] = tokens * state.iterations() / engine_s;
  state.counters["recompute_tokens_per_s"] = tokens * state.iterations() / recompute_s;
  state.counters["kv_over_recompute_speed"] = recompute_s / engine_s;
}

// FLOP/s of torch matmul for one decode iteration's dense GEMMs with B rows.
double decode_matmul_bound(const ModelConfig& c, int64_t B) {
  const int64_t d = c.hidden_size, kv = c.n_kv_heads * c.head_dim(), f = c.intermediate_size;
  std::vector<std::pair<at::Tensor, at::Tensor>> ops;
  double flops = 0;
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (auto [o, i] : {std::pair{d, d}, std::pair{kv, d}, std::pair{kv, d}, std::pair{d, d}, std::pair{f, d},
                        std::pair{f, d}, std::pair{d, f}}) {
      ops.emplace_back(at::randn({B, i}), at::randn({o, i}));
      flops += 2.0 * B * o * i;
    }
  ops.emplace_back(at::randn({B, d}), at::randn({c.vocab_size, d}));
  flops += 2.0 * B * c.vocab_size * d;
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    for (auto& [x, w] : ops) at::linear(x, w);  // the op the model itself calls
    best = std::min(best, since(t0));
  }
  return flops / best;
}

void BM_DecodeShare(benchmark::State& state) {
  const ModelConfig c = model_50m();
  Transformer m(c, 1, at::kCPU);
  const int64_t B = 64;
  const double bound = decode_matmul_bound(c, B);
  Engine e(EngineConfig{16, 64 * 80, B, 4096, false}, m);
  for (const auto& r : requests(int(B), 1, 16, 48, 1.0)) e.add_request(r);
  e.step();  // prefill every prompt (and the first token)
  for (int i = 0; i < 2; ++i) e.step();  // warm-up decode
  double seconds = 0;
  int64_t tokens = 0;
  for (auto _ : state) {
    const int64_t before = e.stats().generated_tokens;
    auto t0 = Clock::now();
    e.step();
    double s = since(t0);
    state.SetIterationTime(s);
    seconds += s;
    tokens += e.stats().generated_tokens - before;
  }
  const double flops = 2.0 * double(c.matmul_params()) * double(tokens) / seconds;
  state.counters["decode_tokens_per_s"] = double(tokens) / seconds;
  state.counters["decode_TFLOPs"] = flops / 1e12;
  state.counters["matmul_TFLOPs"] = bound / 1e12;
  state.counters["decode_share_of_matmul"] = flops / bound;
}

// Decode steps at 64 running sequences on the ~50M model: an engine on bf16 weights
// and KV cache (rollout.precision = bf16) against one on fp32, alternating steps.
// Counter bf16_over_fp32 = bf16 decode-step time / fp32 decode-step time.
void BM_DecodeBf16VsFp32(benchmark::State& state) {
  const ModelConfig c = model_50m();
  Transformer m32(c, 1, at::kCPU), m16(c, 1, at::kCPU, at::kBFloat16);
  const int64_t B = 64;
  Engine e32(EngineConfig{16, 64 * 80, B, 4096, false}, m32), e16(EngineConfig{16, 64 * 80, B, 4096, false}, m16);
  for (Engine* e : {&e32, &e16}) {
    for (const auto& r : requests(int(B), 1, 16, 48, 1.0)) e->add_request(r);
    for (int i = 0; i < 3; ++i) e->step();  // prefill, then warm-up decode
  }
  const AbSeconds s = alternate(state, wall_seconds, [&] { e16.step(); }, [&] { e32.step(); });
  state.counters["bf16_ms"] = 1e3 * s.a / double(state.iterations());
  state.counters["fp32_ms"] = 1e3 * s.b / double(state.iterations());
  state.counters["bf16_over_fp32"] = s.a / s.b;
}

void BM_DecodeKvE4m3VsBf16(benchmark::State& state) {
  const ModelConfig c = [] {
    ModelConfig q = quickstart_model();
    q.max_seq_len = 2048;
    return q;
  }();
  Transformer m(c, 1, at::kCPU, at::kBFloat16);
  const int64_t B = 32;
  EngineConfig bf16{16, B * 1100, B, 8192, false}, e4m3 = bf16;
  e4m3.kv_cache_dtype = at::kFloat8_e4m3fn;
  Engine eb(bf16, m), ee(e4m3, m);
  for (Engine* e : {&eb, &ee}) {
    for (const auto& r : requests(int(B), 1, 1024, 64, 1.0)) e->add_request(r);
    while (e->stats().generated_tokens < B) e->step();  // the prefills, then a first decode
    for (int i = 0; i < 2; ++i) e->step();             // warm-up
  }
  const AbSeconds s = alternate(state, wall_seconds, [&] { ee.step(); }, [&] { eb.step(); });
  state.counters["e4m3_ms"] = 1e3 * s.a / double(state.iterations());
  state.counters["bf16_ms"] = 1e3 * s.b / double(state.iterations());
  state.counters["e4m3_over_bf16"] = s.a / s.b;
  state.counters["bytes_per_token_e4m3"] = double(KvCache::allocate(c, 1, at::kFloat8_e4m3fn).bytes_per_token());
  state.counters["bytes_per_token_bf16"] = double(KvCache::allocate(c, 1, at::kBFloat16).bytes_per_token());
}

// One engine-shaped incremental forward: 32 sequences decoding at 1024 cached tokens
// next to a 1024-token prefill chunk, quickstart-size model. Decode rows attend apart
// from the chunk (what slimpi does) vs all rows padded to the chunk in one batch (the
// path before: no split, and no per-sequence attention for a batch over the padded
// budget, which would otherwise take the unsplit batch too). Counter padded_over_split.
void BM_DecodeNextToPrefill(benchmark::State& state) {
  const ModelConfig c = [] {
    ModelConfig q = quickstart_model();
    q.max_seq_len = 4096;
    return q;
  }();
  Transformer m(c, 1, at::kCPU);
  const int64_t n_decode = 32, context = 1024, chunk = 1024;
  KvCache cache = KvCache::allocate(c, (n_decode + 1) * (context + chunk), at::kFloat);
  std::vector<CachedSequence> seqs;
  std::vector<int64_t> tokens;
  for (int64_t s = 0; s < n_decode; ++s) {
    seqs.push_back({context, 1, at::arange(s * (context + 1), (s + 1) * (context + 1), at::kLong)});
    tokens.push_back(s % 250);
  }
  const int64_t base = n_decode * (context + 1);
  seqs.push_back({0, chunk, at::arange(base, base + chunk, at::kLong)});
  for (int64_t i = 0; i < chunk; ++i) tokens.push_back(i % 250);
  const at::Tensor t = at::tensor(tokens, at::kLong);
  auto run = [&](bool split) {
    m.set_split_decode_and_prefill(split);
    m.set_padded_attention_budget(split ? Transformer::kPaddedAttentionBudget : INT64_MAX);
    at::NoGradGuard no_grad;
    m.forward_incremental(t, seqs, cache);
  };
  run(true);
  run(false);
  const AbSeconds s = alternate(state, wall_seconds, [&] { run(true); }, [&] { run(false); });
  state.counters["split_ms"] = 1e3 * s.a / double(state.iterations());
  state.counters["padded_ms"] = 1e3 * s.b / double(state.iterations());
  state.counters["padded_over_split"] = s.b / s.a;
}

// One decode iteration's forward at 64 sequences with 1024-token contexts on the ~50M
// model, the KV history in 16-token blocks scattered over the pool (as after churn).
// The decode rows read the cache three ways, alternating in one run: the paged kernel
// (the engine's CPU path), a gather into the reused buffer (the device path), and a
// fresh padded copy per layer (the code before the paged kernel). Model FLOPs =
// 2 · dense params · 64 (projections) + 4 · 64 · heads · context · head_dim per layer
// (scores and weighted values); the bound is torch matmul on the same shapes: `linear`
// at [64, d] for the projections and `matmul` of each sequence's queries against its
// keys and values laid out contiguously ([B·Hkv, g, D] x [B·Hkv, D, context] and back).
// Counters: <path>_share_of_matmul (model FLOP/s / bound FLOP/s), fresh_over_paged,
// gather_over_paged (time).
void BM_DecodeLongContext(benchmark::State& state) {
  ModelConfig c = model_50m();
  c.max_seq_len = 2048;
  Transformer m(c, 1, at::kCPU);
  const int64_t B = 64, context = 1024, bs = 16, blocks_per_seq = context / bs;
  const int64_t Hkv = c.n_kv_heads, g = c.n_heads / Hkv, D = c.head_dim();
  KvCache cache = KvCache::allocate(c, B * context, at::kFloat);
  for (size_t l = 0; l < cache.k.size(); ++l) {  // values matter only for the softmax's shape
    cache.k[l].normal_();
    cache.v[l].normal_();
  }
  at::Generator gen = at::detail::createCPUGenerator(3);
  const at::Tensor block_of = at::randperm(B * blocks_per_seq, gen, at::kLong);  // logical -> physical block
  std::vector<CachedSequence> seqs;
  for (int64_t s = 0; s < B; ++s) {
    at::Tensor blocks = block_of.narrow(0, s * blocks_per_seq, blocks_per_seq);                 // [blocks]
    at::Tensor slots = (blocks.unsqueeze(1) * bs + at::arange(bs, at::kLong)).reshape({-1});  // [context]
    seqs.push_back({context - 1, 1, slots});
  }
  const at::Tensor tokens = at::arange(B, at::kLong) % 250;
  using Mode = Transformer::DecodeAttention;
  auto run = [&](Mode mode) {
    m.set_decode_attention(mode);
    at::NoGradGuard no_grad;
    m.forward_incremental(tokens, seqs, cache);
  };
  // The bound: torch matmul on the same shapes.
  const double proj_flops = 2.0 * double(c.matmul_params()) * B;
  const double attn_flops = 4.0 * B * c.n_heads * context * D * c.n_layers;
  const double proj_bound = decode_matmul_bound(c, B);
  const at::Tensor q = at::randn({B * Hkv, g, D}), kt = at::randn({B * Hkv, D, context}),
                   vv = at::randn({B * Hkv, context, D});
  double attn_bound_s = 1e30;
  for (int rep = 0; rep < 3; ++rep)
    attn_bound_s = std::min(attn_bound_s, wall_seconds([&] {
      for (int64_t l = 0; l < c.n_layers; ++l) at::matmul(at::matmul(q, kt), vv);
    }));
  const double bound = (proj_flops + attn_flops) / (proj_flops / proj_bound + attn_bound_s);
  for (Mode mode : {Mode::Paged, Mode::Gather, Mode::FreshGather}) run(mode);  // warm-up
  const AbSeconds pf =
      alternate(state, wall_seconds, [&] { run(Mode::Paged); }, [&] { run(Mode::FreshGather); });
  double gather_s = 0;
  for (int64_t i = 0; i < state.iterations(); ++i) gather_s += wall_seconds([&] { run(Mode::Gather); });
  const double n = double(state.iterations()), flops = proj_flops + attn_flops;
  state.counters["paged_ms"] = 1e3 * pf.a / n;
  state.counters["gather_ms"] = 1e3 * gather_s / n;
  state.counters["fresh_ms"] = 1e3 * pf.b / n;
  state.counters["bound_ms"] = 1e3 * flops / bound;
  state.counters["paged_share_of_matmul"] = flops / (pf.a / n) / bound;
  state.counters["gather_share_of_matmul"] = flops / (gather_s / n) / bound;
  state.counters["fresh_share_of_matmul"] = flops / (pf.b / n) / bound;
  state.counters["fresh_over_paged"] = pf.b / pf.a;
  state.counters["gather_over_paged"] = gather_s / pf.a;
}

void BM_GroupPrefill(benchmark::State& state) {
  ModelConfig c = quickstart_model();
  c.max_seq_len = 1024;
  Transformer m(c, 1, at::kCPU);
  auto timed = [&](const std::vector<GenerationRequest>& reqs, bool prefix_cache) {
    Engine e(EngineConfig{16, 1 << 17, 64, 2048, prefix_cache}, m);
    auto t0 = Clock::now();
    for (const auto& r : reqs) e.add_request(r);
    e.run_to_completion();
    return since(t0);
  };
  const std::vector<GenerationRequest> grouped = requests(32, 8, 512, 1, 1.0);
  std::vector<GenerationRequest> single;
  for (const auto& r : grouped)
    for (int64_t i = 0; i < r.n_samples; ++i) {
      GenerationRequest one = r;
      one.n_samples = 1;
      one.group_index = r.group_index * r.n_samples + i;
      single.push_back(one);
    }
  for (auto _ : state) {
    const double shared_s = timed(grouped, true);
    const double unshared_s = timed(single, false);
    state.SetIterationTime(shared_s);
    state.counters["shared_ms"] = 1e3 * shared_s;
    state.counters["unshared_ms"] = 1e3 * unshared_s;
    state.counters["unshared_over_shared"] = unshared_s / shared_s;
  }
}

void BM_SmallBatchLinear(benchmark::State& state) {
  at::NoGradGuard no_grad;
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  at::Generator g = at::detail::createCPUGenerator(7);
  std::vector<at::Tensor> weights;
  for (int i = 0; i < 8; ++i) weights.push_back(at::randn({N, K}, g, at::kFloat));  // [N, K]
  const at::Tensor x = at::randn({M, K}, g, at::kFloat);                             // [M, K]
  const double bytes = 8.0 * double(N * K) * sizeof(float);
  double bound_s = 0;
  float sink = 0;
  const AbSeconds t = alternate(
      state, wall_seconds,
      [&] {
        for (const auto& w : weights) benchmark::DoNotOptimize(small_batch_linear(x, w));
      },
      [&] {
        for (const auto& w : weights) benchmark::DoNotOptimize(at::linear(x, w));
      });
  const double n = double(state.iterations());
  for (int64_t i = 0; i < state.iterations(); ++i)
    bound_s += wall_seconds([&] {
      for (const auto& w : weights) sink += w.sum().item<float>();
    });
  benchmark::DoNotOptimize(sink);
  state.counters["kernel_gb_per_s"] = bytes * n / t.a / 1e9;
  state.counters["mkl_gb_per_s"] = bytes * n / t.b / 1e9;
  state.counters["bound_gb_per_s"] = bytes * n / bound_s / 1e9;
  state.counters["kernel_over_mkl"] = t.b / t.a;
}

// One decode forward of B sequences at 1024 cached tokens on a model with DeepSeek-V3's
// attention shape at reduced width (d 1024, 16 heads of 128 + 64 query/key and 128 value
// dims, key/value latent 512, query latent 384, 2 dense layers): the latent cache with
// the absorbed product (the engine's) against the expanded keys and values cached per
// head, alternating in one run. Counters: absorbed_ms, expanded_ms, expanded_over_absorbed
// (time), and each cache's bytes per token (KvCache::bytes_per_token, both layers, fp32).
void BM_MlaDecodeAbsorbedVsExpanded(benchmark::State& state) {
  ModelConfig c = quickstart_model();
  c.hidden_size = 1024;
  c.n_layers = 2;
  c.n_heads = c.n_kv_heads = 16;
  c.intermediate_size = 2048;
  c.max_seq_len = 2048;
  c.kv_lora_rank = 512;
  c.q_lora_rank = 384;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.rope_interleave = true;
  Transformer m(c, 1, at::kCPU);
  const int64_t B = state.range(0), context = 1024;
  KvCache latent = KvCache::allocate(c, B * context, at::kFloat, 1, 0, true);
  KvCache expanded = KvCache::allocate(c, B * context, at::kFloat, 1, 0, false);
  for (KvCache* cache : {&latent, &expanded})  // values matter only for the softmax's shape
    for (size_t l = 0; l < cache->k.size(); ++l) {
      cache->k[l].normal_();
      cache->v[l].normal_();
    }
  std::vector<CachedSequence> seqs;
  for (int64_t s = 0; s < B; ++s) seqs.push_back({context - 1, 1, at::arange(s * context, (s + 1) * context, at::kLong)});
  const at::Tensor tokens = at::arange(B, at::kLong) % 250;
  auto run = [&](bool absorbed) {
    m.set_latent_cache(absorbed);
    at::NoGradGuard no_grad;
    m.forward_incremental(tokens, seqs, absorbed ? latent : expanded);
  };
  run(true);
  run(false);
  const AbSeconds t = alternate(state, wall_seconds, [&] { run(true); }, [&] { run(false); });
  const double n = double(state.iterations());
  state.counters["absorbed_ms"] = 1e3 * t.a / n;
  state.counters["expanded_ms"] = 1e3 * t.b / n;
  state.counters["absorbed_tokens_per_s"] = double(B) * n / t.a;
  state.counters["expanded_tokens_per_s"] = double(B) * n / t.b;
  state.counters["expanded_over_absorbed"] = t.b / t.a;
  state.counters["latent_bytes_per_token"] = double(latent.bytes_per_token());
  state.counters["expanded_bytes_per_token"] = double(expanded.bytes_per_token());
}

// Qwen3.5's shape at reduced width: d 1024, 8 layers, full attention 8 query heads of 128
// over 2 key/value heads (gated, a quarter rotated), Gated DeltaNet 8 key heads of 128
// shared by 16 value heads of 128; the Qwen3 model the same without the linear layers.
ModelConfig hybrid_bench_model(bool hybrid, int64_t max_seq_len) {
  ModelConfig c = quickstart_model();
  c.hidden_size = 1024;
  c.n_layers = 8;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.explicit_head_dim = 128;
  c.intermediate_size = 2816;
  c.max_seq_len = max_seq_len;
  c.qk_norm = true;
  if (hybrid) {
    c.full_attention_interval = 4;
    c.linear_num_key_heads = 8;
    c.linear_num_value_heads = 16;
    c.linear_key_head_dim = 128;
    c.linear_value_head_dim = 128;
    c.attn_output_gate = true;
    c.zero_centered_norm = true;
    c.partial_rotary_factor = 0.25;
  }
  return c;
}

void BM_HybridDecodeVsQwen3(benchmark::State& state) {
  const int64_t B = 4, context = state.range(0);
  const ModelConfig hc = hybrid_bench_model(true, context + 1), qc = hybrid_bench_model(false, context + 1);
  Transformer hybrid(hc, 1, at::kCPU), qwen3(qc, 1, at::kCPU);
  KvCache hcache = KvCache::allocate(hc, B * context, at::kFloat, 1, 0, true, /*n_state_slots=*/B);
  KvCache qcache = KvCache::allocate(qc, B * context, at::kFloat, 1, 0, true);
  for (KvCache* cache : {&hcache, &qcache}) {  // values matter only for the softmax's shape
    for (size_t l = 0; l < cache->k.size(); ++l) {
      cache->k[l].normal_();
      cache->v[l].normal_();
    }
    for (auto& s : cache->delta_state) s.normal_(0, 0.1);
    for (auto& s : cache->conv_state) s.normal_();
  }
  std::vector<CachedSequence> seqs;
  for (int64_t s = 0; s < B; ++s)
    seqs.push_back({context - 1, 1, at::arange(s * context, (s + 1) * context, at::kLong), s});
  const at::Tensor tokens = at::arange(B, at::kLong) % 250;
  auto run = [&](const Transformer& m, KvCache& cache) {
    at::NoGradGuard no_grad;
    m.forward_incremental(tokens, seqs, cache);
  };
  run(hybrid, hcache);
  run(qwen3, qcache);
  const AbSeconds t = alternate(state, wall_seconds, [&] { run(hybrid, hcache); }, [&] { run(qwen3, qcache); });
  const double n = double(state.iterations());
  state.counters["hybrid_tokens_per_s"] = double(B) * n / t.a;
  state.counters["qwen3_tokens_per_s"] = double(B) * n / t.b;
  state.counters["hybrid_over_qwen3"] = t.b / t.a;
  state.counters["hybrid_cache_bytes_per_seq"] =
      double(hcache.bytes_per_token() * context + hcache.state_bytes_per_sequence());
  state.counters["qwen3_cache_bytes_per_seq"] = double(qcache.bytes_per_token() * context);
}

void BM_DeltaRuleChunkedVsRecurrent(benchmark::State& state) {
  const int64_t L = 4096, H = 16, D = 128;
  at::Generator gen = at::detail::createCPUGenerator(3);
  auto unit = [&](std::vector<int64_t> shape) {
    at::Tensor x = at::randn(shape, gen, at::kFloat);
    return x / x.norm(2, -1, true);
  };
  const at::Tensor q = unit({1, L, H, D}) / std::sqrt(double(D)), k = unit({1, L, H, D});
  const at::Tensor v = at::randn({1, L, H, D}, gen, at::kFloat);
  const at::Tensor g = at::rand({1, L, H}, gen, at::kFloat).mul(0.1).neg(), beta = at::rand({1, L, H}, gen, at::kFloat);
  at::NoGradGuard no_grad;
  at::Tensor s_chunked, s_recurrent;
  auto chunked = [&] { gated_delta_rule_chunked(q, k, v, g, beta, {}, &s_chunked); };
  auto recurrent = [&] { gated_delta_rule_recurrent(q, k, v, g, beta, {}, &s_recurrent); };
  const AbSeconds t = alternate(state, wall_seconds, chunked, recurrent);
  const double n = double(state.iterations());
  state.counters["chunked_ms"] = 1e3 * t.a / n;
  state.counters["recurrent_ms"] = 1e3 * t.b / n;
  state.counters["recurrent_over_chunked"] = t.b / t.a;
  state.counters["final_state_gap"] = (s_chunked - s_recurrent).abs().max().item<double>();
}

BENCHMARK(BM_KvCacheVsRecompute)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeShare)->Iterations(20)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeBf16VsFp32)->Iterations(20)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeKvE4m3VsBf16)->Iterations(20)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeNextToPrefill)->Iterations(4)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeLongContext)->Iterations(6)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SmallBatchLinear)
    ->ArgsProduct({{1, 2, 4, 8, 16, 32, 64}, {3072}, {1024}})  // the Qwen3-0.6B MLP's weights: 100 MB, past the caches
    ->ArgsProduct({{1, 4, 16, 32, 64}, {344}, {128}})          // the quickstart model's: 1.4 MB, in cache
    ->Iterations(30)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GroupPrefill)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MlaDecodeAbsorbedVsExpanded)->Arg(1)->Arg(8)->Arg(64)->Iterations(6)->UseManualTime()->Unit(
    benchmark::kMillisecond);
BENCHMARK(BM_HybridDecodeVsQwen3)->Arg(1024)->Arg(8192)->Arg(32768)->Iterations(6)->UseManualTime()->Unit(
    benchmark::kMillisecond);
BENCHMARK(BM_DeltaRuleChunkedVsRecurrent)->Iterations(2)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace slimpi::perf
