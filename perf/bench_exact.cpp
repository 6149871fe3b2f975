// Exact on-policy mode's cost (train.on_policy = "exact": the batch-invariant kernels of
// kernels/batch_invariant.h in every forward) against the default kernels, each pair
// timed in the same run, alternating (perf/alternate.h). Shape arg 0: the quickstart
// model (d 128, 4 layers, 0.86M); 1: Qwen3-0.6B's (d 1024, 28 layers, 16 heads over 8 kv
// heads of 128, MLP 3072, vocabulary 151936, tied); 2: the quickstart's with Qwen3.5's
// layers (3 of 4 Gated DeltaNet: 2 key heads of 32 read by 4 value heads of 32, a 4-tap
// convolution; gated full attention every 4th); 3: the quickstart's with DeepSeek-V3's
// latent attention (query latent 64, key/value latent 64, per head 32 no-rope + 16
// rotary and 32 value dimensions).
//   BM_ExactDecode/<shape>/<B>  one engine decode step of B running sequences (16-token
//                          prompts, sampled), an exact engine against a default one on the
//                          same weights. Counters exact_tokens_per_s, default_tokens_per_s,
//                          exact_over_default (time).
//   BM_ExactPrefill/<shape>     a 512-token prompt's forward without gradients (the
//                          engine's prefill kernels; no cache). Counters as above.
//   BM_ExactTrain/<shape>       the trainer's forward and backward of a packed micro-batch
//                          (4 x 128 tokens; the log-probs of its last 96 tokens each,
//                          summed, back-propagated): training tokens a second.
// The last argument: the forwards' precision, 0 fp32, 1 bf16 (train.precision =
// rollout.precision = "bf16": the engines hold bf16 weights and a bf16 cache, the trainer
// runs its fp32 masters through the bf16 forward), exact and default alike.
// Threads: $SLIMPI_THREADS (default 1). Run: build/perf/bench_exact
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <benchmark/benchmark.h>

#include "alternate.h"
#include "kernels/batch_invariant.h"
#include "kernels/counter_rng.h"
#include "model/precision.h"
#include "rollout/engine.h"
#include "tokenizer/byte_tokenizer.h"
#include "train/packed_batch.h"

namespace slimpi::perf {
namespace {

ModelConfig shape(int64_t which) {
  ModelConfig c;
  if (which == 0) {
    c.vocab_size = 260, c.hidden_size = 128, c.n_layers = 4, c.n_heads = 4, c.n_kv_heads = 4;
    c.intermediate_size = 344, c.max_seq_len = 1024;
    return c;
  }
  if (which == 2 || which == 3) {
    c = shape(0);
    if (which == 2) {
      c.full_attention_interval = 4, c.linear_num_key_heads = 2, c.linear_num_value_heads = 4;
      c.linear_key_head_dim = 32, c.linear_value_head_dim = 32, c.linear_conv_kernel_dim = 4;
      c.attn_output_gate = true, c.zero_centered_norm = true, c.qk_norm = true, c.partial_rotary_factor = 0.25;
    } else {
      c.kv_lora_rank = 64, c.q_lora_rank = 64, c.qk_nope_head_dim = 32, c.qk_rope_head_dim = 16;
      c.v_head_dim = 32, c.rope_interleave = true;
    }
    return c;
  }
  c.vocab_size = 151936, c.hidden_size = 1024, c.n_layers = 28, c.n_heads = 16, c.n_kv_heads = 8;
  c.explicit_head_dim = 128, c.intermediate_size = 3072, c.max_seq_len = 1024, c.tie_word_embeddings = true;
  c.qk_norm = true;
  return c;
}

// fn with exact numerics `on` (reading a KV cache of `kv`), then the switch back off.
template <class Fn>
auto in_mode(bool on, Fn fn, at::ScalarType kv = at::kFloat) {
  return [on, fn, kv] {
    set_exact_numerics(on);
    set_exact_kv_storage(kv);
    fn();
    set_exact_numerics(false);
    set_exact_kv_storage(at::kFloat);
  };
}

Precision precision_arg(const benchmark::State& state, int index) {
  return state.range(index) == 1 ? Precision::BF16 : Precision::FP32;
}

void report(benchmark::State& state, const AbSeconds& t, double tokens_per_iteration) {
  const double n = double(state.iterations());
  state.counters["exact_tokens_per_s"] = tokens_per_iteration * n / t.a;
  state.counters["default_tokens_per_s"] = tokens_per_iteration * n / t.b;
  state.counters["exact_over_default"] = t.a / t.b;
}

void BM_ExactDecode(benchmark::State& state) {
  const at::ScalarType weights = weight_dtype(precision_arg(state, 2));
  const Transformer m(shape(state.range(0)), 1, at::kCPU, weights);
  const int64_t B = state.range(1);
  std::vector<GenerationRequest> reqs;
  for (int64_t g = 0; g < B; ++g) {
    GenerationRequest r;
    r.group_index = g;
    r.prompt.push_back(ByteTokenizer::kBos);
    for (int64_t i = 1; i < 16; ++i) r.prompt.push_back((g * 17 + i * 3) % 256);
    r.params.temperature = 1.0;
    r.params.max_new_tokens = 200;  // (no stop: running through every iteration)
    r.seed = mix_seed(1, 0, uint64_t(g));
    reqs.push_back(r);
  }
  const EngineConfig cfg{16, B * 256, B, 4096, false};
  Engine exact(cfg, m), plain(cfg, m);
  for (const auto& r : reqs) {
    exact.add_request(r);
    plain.add_request(r);
  }
  in_mode(true, [&] { exact.step(); exact.step(); }, weights)();  // prefill and a first decode step
  in_mode(false, [&] { plain.step(); plain.step(); })();
  report(state,
         alternate(state, wall_seconds, in_mode(true, [&] { exact.step(); }, weights),
                   in_mode(false, [&] { plain.step(); })),
         double(B));
}

void BM_ExactPrefill(benchmark::State& state) {
  const Precision precision = precision_arg(state, 1);
  const Transformer m(shape(state.range(0)), 1, at::kCPU, weight_dtype(precision));
  const at::Tensor tokens = at::arange(512, at::kLong) * 7 % 256;
  auto prefill = [&] {
    at::NoGradGuard no_grad;
    ForwardPrecision scope(precision, at::kCPU);
    benchmark::DoNotOptimize(m.forward_packed(tokens, {512}));
  };
  report(state, alternate(state, wall_seconds, in_mode(true, prefill), in_mode(false, prefill)), 512.0);
}

void BM_ExactTrain(benchmark::State& state) {
  const Precision precision = precision_arg(state, 1);
  const Transformer m(shape(state.range(0)), 1, at::kCPU);  // fp32 masters
  std::vector<Sample> samples(4);
  for (size_t i = 0; i < samples.size(); ++i) {
    for (int64_t t = 0; t < 128; ++t) samples[i].tokens.push_back((int64_t(i) * 13 + t * 5) % 256);
    samples[i].prompt_length = 32;
  }
  const PackedBatch b = pack(samples, {0, 1, 2, 3}, at::kCPU);
  auto step = [&] {
    packed_log_probs(m, b, precision, 1.0, false).logp.sum().backward();
    for (const auto& p : m.parameters()) p.tensor.mutable_grad() = at::Tensor();
  };
  report(state, alternate(state, wall_seconds, in_mode(true, step), in_mode(false, step)), 512.0);
}

BENCHMARK(BM_ExactDecode)
    ->ArgsProduct({{0, 1, 2, 3}, {1, 8, 64}, {0, 1}})
    ->Iterations(10)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ExactPrefill)
    ->ArgsProduct({{0, 1, 2, 3}, {0, 1}})
    ->Iterations(4)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ExactTrain)->ArgsProduct({{0, 1, 2, 3}, {0, 1}})->Iterations(4)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace slimpi::perf
