// train_memory — what one trainer rank holds under a model-parallel layout, measured.
//   mpirun -np N perf/train_memory TP DO RECOMPUTE TOKENS [HIDDEN LAYERS VOCAB]
// TP: parallel.tensor_parallel (the rest of the N ranks are data-parallel); DO: 1 =
// the distributed optimizer; RECOMPUTE: none | selective | full; TOKENS: tokens per
// rank in the one micro-batch of each step (one sequence). Builds a dense policy of the
// given shape (heads of 64), runs two RL optimizer steps and prints one JSON line per
// rank: the bytes of parameters, gradient buffers and AdamW moments it holds
// (Trainer::state_bytes) and its peak resident set before the first step and after the
// second (getrusage ru_maxrss: the kernel's high-water mark; the difference is what the
// steps' activations and temporaries added). CPU only.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <mpi.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "parallel/device.h"
#include "parallel/mpi_comm.h"
#include "train/model_parallel.h"
#include "train/trainer.h"

namespace {

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_maxrss) * 1024;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace slimpi;
  MPI_Init(&argc, &argv);
  if (argc < 5) {
    std::fprintf(stderr, "usage: train_memory TP DO(0|1) RECOMPUTE(none|selective|full) TOKENS [HIDDEN LAYERS VOCAB]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int tp = std::atoi(argv[1]);
  const bool distributed = std::atoi(argv[2]) != 0;
  const std::string recompute = argv[3];
  const int64_t tokens = std::atoll(argv[4]);
  ModelConfig cfg;
  cfg.hidden_size = argc > 5 ? std::atoll(argv[5]) : 512;
  cfg.n_layers = argc > 6 ? std::atoll(argv[6]) : 8;
  cfg.vocab_size = argc > 7 ? std::atoll(argv[7]) : 4096;
  cfg.n_heads = cfg.hidden_size / 64;
  cfg.n_kv_heads = cfg.n_heads;
  cfg.intermediate_size = cfg.hidden_size * 3;
  cfg.max_seq_len = tokens;
  {
    ModelParallel mp(MPI_COMM_WORLD, tp, 1, DeviceChoice{});
    Transformer policy(cfg, 1, at::kCPU, at::kFloat, {}, mp.tensor_shard());
    TrainerConfig tc;
    tc.mode = "rl";
    tc.distributed_optimizer = distributed;
    tc.recompute = recompute == "full"        ? Transformer::Recompute::Full
                   : recompute == "selective" ? Transformer::Recompute::Selective
                                              : Transformer::Recompute::None;
    tc.n_micro_batches = 1;
    Trainer trainer(tc, policy, &mp.data());
    const int64_t before = peak_rss_bytes();
    for (int step = 0; step < 2; ++step) {
      at::Generator g = at::detail::createCPUGenerator(uint64_t(10 + mp.data_index()));
      Sample s;
      at::Tensor t = at::randint(cfg.vocab_size, {tokens}, g, at::kLong);
      s.tokens.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + tokens);
      s.prompt_length = 1;
      s.reward = 1.0f;
      std::vector<Sample> local{s};
      trainer.prepare_rollout(local, false);
      trainer.train_step(local);
    }
    const Trainer::StateBytes b = trainer.state_bytes();
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::printf("{\"rank\": %d, \"tp\": %d, \"dp\": %d, \"distributed_optimizer\": %d, \"recompute\": \"%s\", "
                "\"tokens\": %lld, \"model_params\": %lld, \"param_bytes\": %lld, \"grad_bytes\": %lld, "
                "\"optimizer_bytes\": %lld, \"peak_rss_before\": %lld, \"peak_rss_after\": %lld}\n",
                rank, tp, mp.data_size(), int(distributed), recompute.c_str(), (long long)tokens,
                (long long)cfg.n_params(), (long long)b.params, (long long)b.grads, (long long)b.optimizer,
                (long long)before, (long long)peak_rss_bytes());
    std::fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}
