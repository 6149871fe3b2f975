// train_memory — what one trainer rank holds under a model-parallel layout, measured.
//   mpirun -np N perf/train_memory TP DO RECOMPUTE TOKENS [HIDDEN LAYERS VOCAB [PRECISION [CP [STEPS [KV_HEADS
//                                  [PP [MICRO [STAGE_LAYERS]]]]]]]]
// TP: parallel.tensor_parallel, CP: parallel.context_parallel (default 1; the rest of the
// N ranks are data-parallel); STEPS: optimizer steps (default 2); KV_HEADS: key/value
// heads (default: one per query head); PP: parallel.pipeline_parallel (default 1); MICRO:
// samples of TOKENS tokens a step, one micro-batch each (default 1); STAGE_LAYERS: the
// layers of each stage, comma-separated (default: even); DO: 1 =
// the distributed optimizer; RECOMPUTE: none | selective | full; TOKENS: tokens per
// rank in the one micro-batch of each step (one sequence); PRECISION: fp32 (default) or
// bf16 (train.precision: bf16 products over fp32 masters). Builds a dense policy of the
// given shape (heads of 64), runs two RL optimizer steps and prints one JSON line per
// rank: the seconds of the last step (its log-prob pass and its optimizer step) and of its
// optimizer step alone, the seconds that step waited for neighbouring pipeline stages,
// the bytes of parameters, gradient buffers and AdamW moments it holds
// (Trainer::state_bytes), the peak of the bytes torch's CPU allocator had handed out
// (every tensor's storage; what torch.cuda.max_memory_allocated counts on a GPU: not
// the scratch space oneDNN or MKL take with their own allocations), counted by an
// allocator installed in place of torch's before anything is allocated, and its peak
// resident set before the first step and after the second (getrusage ru_maxrss: the
// kernel's high-water mark; the difference is what the steps' activations and
// temporaries added). CPU only.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <mpi.h>
#include <sys/resource.h>

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "model/pipeline_shard.h"
#include "model/precision.h"
#include "parallel/device.h"
#include "parallel/mpi_comm.h"
#include "train/model_parallel.h"
#include "train/trainer.h"

namespace {

// Counts the bytes of every CPU allocation torch makes through it (current and peak).
// Allocates as torch's default CPU allocator does (c10::alloc_cpu, 64-byte aligned),
// with the size kept in a 64-byte header before the data, so that the data pointer is
// its own context, as raw_allocate (oneDNN's bf16 products) requires.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  static constexpr size_t kHeader = 64;
  c10::DataPtr allocate(size_t n) override {
    auto* raw = static_cast<char*>(c10::alloc_cpu(n + kHeader));
    std::memcpy(raw, &n, sizeof(n));
    const int64_t now = current_.fetch_add(int64_t(n)) + int64_t(n);
    for (int64_t p = peak_.load(); now > p && !peak_.compare_exchange_weak(p, now);) {
    }
    void* data = raw + kHeader;
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
  static int64_t peak() { return peak_.load(); }
  static int64_t current() { return current_.load(); }

 private:
  static void release(void* data) {
    if (!data) return;
    char* raw = static_cast<char*>(data) - kHeader;
    size_t n = 0;
    std::memcpy(&n, raw, sizeof(n));
    current_.fetch_sub(int64_t(n));
    c10::free_cpu(raw);
  }
  static inline std::atomic<int64_t> current_{0}, peak_{0};
};

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_maxrss) * 1024;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace slimpi;
  static CountingCpuAllocator counting;
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  MPI_Init(&argc, &argv);
  if (argc < 5) {
    std::fprintf(stderr, "usage: train_memory TP DO(0|1) RECOMPUTE(none|selective|full) TOKENS [HIDDEN LAYERS VOCAB "
                 "[fp32|bf16 [CP [STEPS [KV_HEADS [PP [MICRO [STAGE_LAYERS]]]]]]]]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const std::string precision = argc > 8 ? argv[8] : "fp32";
  const int tp = std::atoi(argv[1]);
  const bool distributed = std::atoi(argv[2]) != 0;
  const std::string recompute = argv[3];
  const int64_t tokens = std::atoll(argv[4]);
  const int cp = argc > 9 ? std::atoi(argv[9]) : 1;
  const int n_steps = argc > 10 ? std::atoi(argv[10]) : 2;
  const int pp = argc > 12 ? std::atoi(argv[12]) : 1;
  const int n_micro = argc > 13 ? std::atoi(argv[13]) : 1;
  std::vector<int64_t> stage_layers;
  if (argc > 14)
    for (const char* p = argv[14]; *p;) {
      char* end = nullptr;
      stage_layers.push_back(std::strtoll(p, &end, 10));
      p = *end == ',' ? end + 1 : end;
    }
  ModelConfig cfg;
  cfg.hidden_size = argc > 5 ? std::atoll(argv[5]) : 512;
  cfg.n_layers = argc > 6 ? std::atoll(argv[6]) : 8;
  cfg.vocab_size = argc > 7 ? std::atoll(argv[7]) : 4096;
  cfg.n_heads = cfg.hidden_size / 64;
  cfg.n_kv_heads = argc > 11 ? std::atoll(argv[11]) : cfg.n_heads;
  cfg.intermediate_size = cfg.hidden_size * 3;
  cfg.max_seq_len = tokens;
  {
    ModelParallel mp(MPI_COMM_WORLD, tp, 1, DeviceChoice{}, false, 1, cp, pp);
    Transformer policy(cfg, 1, at::kCPU, at::kFloat, {}, mp.tensor_shard(), mp.context_shard(),
                       mp.pipeline_shard(stage_layer_counts(cfg.n_layers, pp, stage_layers)));
    TrainerConfig tc;
    tc.mode = "rl";
    tc.distributed_optimizer = distributed;
    tc.recompute = recompute == "full"        ? Transformer::Recompute::Full
                   : recompute == "selective" ? Transformer::Recompute::Selective
                                              : Transformer::Recompute::None;
    tc.n_micro_batches = n_micro;
    tc.precision = parse_precision(precision);
    Trainer trainer(tc, policy, &mp.data(), nullptr, nullptr, &mp.replicas());
    const int64_t before = peak_rss_bytes(), allocated_before = counting.current();
    double step_s = 0, train_s = 0;
    for (int step = 0; step < n_steps; ++step) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto start = std::chrono::steady_clock::now();
      at::Generator g = at::detail::createCPUGenerator(uint64_t(10 + mp.data_index()));
      std::vector<Sample> local;
      for (int i = 0; i < n_micro; ++i) {
        Sample s;
        at::Tensor t = at::randint(cfg.vocab_size, {tokens}, g, at::kLong);
        s.tokens.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + tokens);
        s.prompt_length = 1;
        s.reward = float(i % 2);
        local.push_back(s);
      }
      trainer.prepare_rollout(local, false);
      const auto train_start = std::chrono::steady_clock::now();
      trainer.train_step(local);
      train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start).count();
      MPI_Barrier(MPI_COMM_WORLD);
      step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    const Trainer::StateBytes b = trainer.state_bytes();
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::printf("{\"rank\": %d, \"tp\": %d, \"cp\": %d, \"pp\": %d, \"stage\": %d, \"micro_batches\": %d, "
                "\"step_s\": %.3f, \"train_s\": %.4f, \"pipeline_wait_s\": %.4f, \"dp\": %d, \"distributed_optimizer\": %d, \"recompute\": \"%s\", "
                "\"precision\": \"%s\", \"tokens\": %lld, \"model_params\": %lld, \"param_bytes\": %lld, "
                "\"grad_bytes\": %lld, \"optimizer_bytes\": %lld, \"allocated_before_steps\": %lld, "
                "\"peak_allocated\": %lld, \"peak_rss_before\": %lld, \"peak_rss_after\": %lld}\n",
                rank, tp, cp, pp, mp.stage(), n_micro, step_s, train_s, trainer.pipeline_wait_seconds(), mp.data_size(), int(distributed), recompute.c_str(), precision.c_str(), (long long)tokens,
                (long long)cfg.n_params(), (long long)b.params, (long long)b.grads, (long long)b.optimizer,
                (long long)allocated_before, (long long)counting.peak(), (long long)before,
                (long long)peak_rss_bytes());
    std::fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}
