// Training throughput of the policy on one rank, against the bound the same machine
// gives in the same run:
//   BM_TrainStep/<model>   one optimizer step (forward, backward, AdamW) on packed
//                          sequences of 256 tokens. Counters: tokens_per_s, model
//                          TFLOP/s (6·N·tokens / time, N = dense parameters), and
//                          mfu_vs_matmul = that / the FLOP/s torch's matmul reaches on
//                          the model's own GEMM shapes (forward and both backward
//                          products of every linear layer), measured right before.
//   BM_PackedVsPadded      a step on 16 sequences of lengths 32..256 given as they are,
//                          against the same sequences with pad tokens appended up to
//                          256. Both take the same attention path (same count, heads
//                          and longest length): this measures the cost of computing pad
//                          *tokens* (projections, MLP, head). Counter
//                          padded_over_packed_time.
//   BM_PackedAttentionUnpaddedVsPadded  16 sequences of 32..2048 tokens, a small model:
//                          packed attention without padding vs the padded batch (time
//                          and peak memory ratios).
//   BM_MoeLayerVsMatmul    one MoE layer forward + backward vs torch matmul on its GEMMs.
// Models: "10M" (d 320, 8 layers) and "50M" (d 640, 10 layers). Threads: $SLIMPI_THREADS
// (default 1). Run: build/perf/bench_train [--benchmark_filter=10M]
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <benchmark/benchmark.h>

#include <malloc.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>

#include "alternate.h"
#include "model/moe.h"
#include "train/trainer.h"

namespace slimpi::perf {
namespace {

using Clock = std::chrono::steady_clock;

ModelConfig model(int64_t which) {
  ModelConfig c;
  c.vocab_size = 260;
  c.max_seq_len = 256;
  if (which == 10) {
    c.hidden_size = 320, c.n_layers = 8, c.n_heads = 8, c.n_kv_heads = 8, c.intermediate_size = 864;
  } else {
    c.hidden_size = 640, c.n_layers = 10, c.n_heads = 10, c.n_kv_heads = 10, c.intermediate_size = 1728;
  }
  return c;
}

std::vector<Sample> batch(const std::vector<int64_t>& lengths, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  std::vector<Sample> out;
  for (int64_t len : lengths) {
    Sample s;
    at::Tensor t = at::randint(259, {len}, g, at::kLong);
    s.tokens.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + len);
    s.prompt_length = 16;
    out.push_back(s);
  }
  return out;
}

// FLOP/s of torch matmul on the GEMMs one training step of `c` runs for T tokens:
// for every linear layer [out, in]: forward [T,in]x[in,out], and the backward
// products [T,out]x[out,in] (input grad) and [out,T]x[T,in] (weight grad).
// On `options`' device and dtype (default: fp32 on the CPU).
double matmul_bound(const ModelConfig& c, int64_t T, const at::TensorOptions& options = at::kFloat) {
  const int64_t d = c.hidden_size, kv = c.n_kv_heads * c.head_dim(), f = c.intermediate_size;
  std::vector<std::pair<int64_t, int64_t>> layers;  // (out, in)
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (auto s : {std::pair{d, d}, std::pair{kv, d}, std::pair{kv, d}, std::pair{d, d}, std::pair{f, d},
                   std::pair{f, d}, std::pair{d, f}})
      layers.push_back(s);
  layers.push_back({c.vocab_size, d});
  std::vector<std::array<at::Tensor, 6>> ops;
  for (auto [o, i] : layers)
    ops.push_back({at::randn({T, i}, options), at::randn({i, o}, options), at::randn({T, o}, options),
                   at::randn({o, i}, options), at::randn({o, T}, options), at::randn({T, i}, options)});
  double flops = 0;
  for (auto [o, i] : layers) flops += 3.0 * 2.0 * double(T) * double(o) * double(i);
  double best = 1e30;
  auto finish = [&] { ops.back()[0].sum().item<float>(); };  // waits for the device's queue
  finish();
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = Clock::now();
    for (auto& x : ops) {
      at::mm(x[0], x[1]);
      at::mm(x[2], x[3]);
      at::mm(x[4], x[5]);
    }
    finish();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return flops / best;
}

// Counters of a training benchmark: T tokens per step, per_step seconds, bound = matmul
// FLOP/s on the step's GEMM shapes.
void report_training(benchmark::State& state, const ModelConfig& c, int64_t n_params, int64_t T, double per_step,
                     double bound) {
  const double model_flops = 6.0 * double(c.matmul_params()) * double(T) / per_step;
  state.counters["params_M"] = double(n_params) / 1e6;
  state.counters["tokens_per_s"] = double(T) / per_step;
  state.counters["model_TFLOPs"] = model_flops / 1e12;
  state.counters["matmul_TFLOPs"] = bound / 1e12;
  state.counters["mfu_vs_matmul"] = model_flops / bound;
}

// Times one train_step per iteration (after the caller's warm-up) and reports.
void time_steps(benchmark::State& state, Trainer& trainer, std::vector<Sample>& samples, const ModelConfig& c,
                int64_t n_params, int64_t T, double bound) {
  double seconds = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    trainer.train_step(samples);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    state.SetIterationTime(s);
    seconds += s;
  }
  report_training(state, c, n_params, T, seconds / double(state.iterations()), bound);
}

TrainerConfig config() {
  TrainerConfig c;
  c.mode = "sft";
  c.lr.lr = 1e-4;
  return c;
}

void BM_TrainStep(benchmark::State& state) {
  const ModelConfig c = model(state.range(0));
  const int64_t n_seq = state.range(0) == 10 ? 8 : 4, T = n_seq * 256;
  const double bound = matmul_bound(c, T);
  Transformer m(c, 1, at::kCPU);
  Trainer trainer(config(), m, nullptr);
  auto samples = batch(std::vector<int64_t>(n_seq, 256), 3);
  trainer.train_step(samples);  // warm-up
  time_steps(state, trainer, samples, c, m.n_params(), T, bound);
}

void BM_PackedVsPadded(benchmark::State& state) {
  const ModelConfig c = model(10);
  Transformer m(c, 1, at::kCPU);
  Trainer trainer(config(), m, nullptr);
  std::vector<int64_t> lengths;
  for (int i = 0; i < 16; ++i) lengths.push_back(32 + (i * 97) % 225);  // 32..256
  auto packed = batch(lengths, 5);
  auto padded = packed;
  for (auto& s : padded) s.tokens.resize(256, 256);  // PAD to the longest; the extra tokens are computed too
  trainer.train_step(packed);
  double packed_s = 0, padded_s = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    trainer.train_step(packed);
    auto t1 = Clock::now();
    trainer.train_step(padded);
    auto t2 = Clock::now();
    packed_s += std::chrono::duration<double>(t1 - t0).count();
    padded_s += std::chrono::duration<double>(t2 - t1).count();
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  state.counters["packed_ms"] = 1e3 * packed_s / state.iterations();
  state.counters["padded_ms"] = 1e3 * padded_s / state.iterations();
  state.counters["padded_over_packed_time"] = padded_s / packed_s;
}

// One optimizer step with train.precision = bf16 (autocast over fp32 masters) against
// fp32, on the same model size and batch, alternating every iteration (two models and
// trainers, same seed). Counter bf16_over_fp32 = bf16 step time / fp32 step time.
void BM_TrainStepBf16VsFp32(benchmark::State& state) {
  const ModelConfig c = model(state.range(0));
  const int64_t n_seq = state.range(0) == 10 ? 8 : 4;
  Transformer m32(c, 1, at::kCPU), m16(c, 1, at::kCPU);
  TrainerConfig c16 = config();
  c16.precision = Precision::BF16;
  Trainer fp32(config(), m32, nullptr), bf16(c16, m16, nullptr);
  auto samples = batch(std::vector<int64_t>(n_seq, 256), 3);
  fp32.train_step(samples);  // warm-up both
  bf16.train_step(samples);
  const AbSeconds s =
      alternate(state, wall_seconds, [&] { bf16.train_step(samples); }, [&] { fp32.train_step(samples); });
  state.counters["bf16_ms"] = 1e3 * s.a / double(state.iterations());
  state.counters["fp32_ms"] = 1e3 * s.b / double(state.iterations());
  state.counters["bf16_over_fp32"] = s.a / s.b;
}

// bf16 training on the GPU: a ~0.5B model (d 1536, 16 layers, SwiGLU 4096) on 4
// sequences of 2048 tokens, one optimizer step, against torch's bf16 matmul on the same
// GEMM shapes on the same GPU. Counter mfu_vs_matmul (the goal: >= 0.4); the
// GPU's bf16 matmul rate is matmul_TFLOPs. Skipped without a GPU.
void BM_GpuTrainStepBf16(benchmark::State& state) {
  if (!at::hasCUDA()) {
    state.SkipWithError("no GPU visible");
    for (auto _ : state) {
    }
    return;
  }
  ModelConfig c;
  c.vocab_size = 260, c.hidden_size = 1536, c.n_layers = 16, c.n_heads = 12, c.n_kv_heads = 4;
  c.intermediate_size = 4096, c.max_seq_len = 2048, c.init_std = 0.02;
  const int64_t n_seq = 4, T = n_seq * 2048;
  const at::Device gpu(at::kCUDA, 0);
  const double bound = matmul_bound(c, T, at::TensorOptions().dtype(at::kBFloat16).device(gpu));
  Transformer m(c, 1, gpu);
  TrainerConfig tc = config();
  tc.precision = Precision::BF16;
  Trainer trainer(tc, m, nullptr);
  auto samples = batch(std::vector<int64_t>(n_seq, 2048), 3);
  trainer.train_step(samples);  // warm-up (train_step ends with host reads: the GPU is idle after)
  time_steps(state, trainer, samples, c, m.n_params(), T, bound);
}

// Peak resident memory growth of `fn` (bytes): freed heap is handed back first
// (malloc_trim) and the kernel's high-water mark reset (/proc/self/clear_refs = 5).
int64_t peak_rss_growth(const std::function<void()>& fn) {
  auto status_kb = [](const char* key) {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key)));
    return 0LL;
  };
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";
  const int64_t before = status_kb("VmRSS:");
  fn();
  return (status_kb("VmHWM:") - before) * 1024;
}

// Training on mixed lengths, packed attention without padding (per-sequence flash
// attention) against the padded batch: a small model (d 64, 2 layers, 4 heads over 2
// KV heads) on 16 sequences of 32..2048 tokens (geometric), one optimizer step each
// way, alternating. Counters padded_over_unpadded_time and padded_over_unpadded_peak
// (peak RSS growth of one step; the padded scores are 16 x 4 x 2048² fp32 per tensor).
void BM_PackedAttentionUnpaddedVsPadded(benchmark::State& state) {
  ModelConfig c;
  c.vocab_size = 260, c.hidden_size = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2;
  c.intermediate_size = 128, c.max_seq_len = 2048;
  std::vector<int64_t> lengths;
  for (int i = 0; i < 16; ++i) lengths.push_back(int64_t(std::llround(32.0 * std::pow(64.0, i / 15.0))));
  Transformer m_pad(c, 1, at::kCPU), m_unpad(c, 1, at::kCPU);
  m_pad.set_padded_attention_budget(int64_t(1) << 50);
  m_unpad.set_padded_attention_budget(0);
  Trainer padded(config(), m_pad, nullptr), unpadded(config(), m_unpad, nullptr);
  auto samples = batch(lengths, 5);
  const int64_t unpadded_peak = peak_rss_growth([&] { unpadded.train_step(samples); });
  const int64_t padded_peak = peak_rss_growth([&] { padded.train_step(samples); });
  const AbSeconds s =
      alternate(state, wall_seconds, [&] { unpadded.train_step(samples); }, [&] { padded.train_step(samples); });
  state.counters["unpadded_ms"] = 1e3 * s.a / double(state.iterations());
  state.counters["padded_ms"] = 1e3 * s.b / double(state.iterations());
  state.counters["padded_over_unpadded_time"] = s.b / s.a;
  state.counters["unpadded_peak_MB"] = double(unpadded_peak) / (1 << 20);
  state.counters["padded_peak_MB"] = double(padded_peak) / (1 << 20);
  state.counters["padded_over_unpadded_peak"] = double(padded_peak) / double(std::max<int64_t>(unpadded_peak, 1));
}

// One MoE layer (model/moe.h), forward and backward, on 4096 tokens of width 512 routed
// to 2 of 8 experts of width 1024, against the bound: torch's matmul on the same GEMMs
// (per expert, its own rows: the three forward products and the six backward ones) with
// the rows the router gave, measured alternately. Counters: moe_ms, gemm_ms and
// moe_vs_matmul = gemm time / MoE time (the share of matmul FLOP/s the layer reaches).
void BM_MoeLayerVsMatmul(benchmark::State& state) {
  const int64_t T = 4096, d = 512, f = 1024, E = 8, k = 2;
  at::Generator g = at::detail::createCPUGenerator(3);
  auto param = [&](std::vector<int64_t> shape) {
    return (at::randn(shape, g) * 0.05).set_requires_grad(true);
  };
  MoeWeights w;
  w.router = param({E, d});
  for (int64_t e = 0; e < E; ++e) {
    w.gate.push_back(param({f, d}));
    w.up.push_back(param({f, d}));
    w.down.push_back(param({d, f}));
  }
  const at::Tensor h = at::randn({T, d}, g).set_requires_grad(true);
  auto moe = [&] {
    MoeLayerOutput o = moe_mlp(h, w, MoeRouting{k, true});
    o.out.sum().backward();
  };
  std::vector<int64_t> rows;  // the router's rows per expert
  {
    at::NoGradGuard no_grad;
    const at::Tensor counts = at::bincount(moe_mlp(h, w, MoeRouting{k, true}).chosen.reshape({-1}), {}, E);
    for (int64_t e = 0; e < E; ++e) rows.push_back(counts[e].item<int64_t>());
  }
  std::vector<at::Tensor> xs, dys, dhs;
  for (int64_t n : rows) {
    xs.push_back(at::randn({n, d}, g));
    dys.push_back(at::randn({n, d}, g));
    dhs.push_back(at::randn({n, f}, g));
  }
  auto gemms = [&] {
    at::NoGradGuard no_grad;
    for (int64_t e = 0; e < E; ++e) {
      const at::Tensor &x = xs[e], &dy = dys[e], &dh = dhs[e];
      at::Tensor a = at::mm(x, w.gate[e].t()), b = at::mm(x, w.up[e].t());  // forward: gate, up
      at::Tensor y = at::mm(dh, w.down[e].t());                             // forward: down
      at::mm(dy, w.down[e]);                                                 // backward of down: dX, dW
      at::mm(dy.t(), dh);
      at::mm(dh, w.gate[e]), at::mm(dh.t(), x);                              // backward of gate
      at::mm(dh, w.up[e]), at::mm(dh.t(), x);                                // backward of up
      benchmark::DoNotOptimize(a.data_ptr<float>() + b.numel() + y.numel());
    }
  };
  moe();  // warm up
  const AbSeconds s = alternate(state, wall_seconds, moe, gemms);
  state.counters["moe_ms"] = 1e3 * s.a / double(state.iterations());
  state.counters["gemm_ms"] = 1e3 * s.b / double(state.iterations());
  state.counters["moe_vs_matmul"] = s.b / s.a;
}

BENCHMARK(BM_TrainStep)->Arg(10)->Arg(50)->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TrainStepBf16VsFp32)->Arg(50)->Iterations(4)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GpuTrainStepBf16)->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PackedAttentionUnpaddedVsPadded)->Iterations(2)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PackedVsPadded)->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MoeLayerVsMatmul)->Iterations(6)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace slimpi::perf
