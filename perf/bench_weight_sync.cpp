// The weight sync between layouts, its two routes on the same layout and bytes, in one
// run (rollout.weight_sync_route; docs/parallelism.md, weight sync):
//   sliced     SlicedWeightSync: each engine rank receives its shard from the trainer
//              ranks that hold it (sync/weight_sync_plan.h);
//   broadcast  the trainer's shards gathered onto trainer rank 0 (gather_whole_model),
//              broadcast whole to every engine rank (WeightSync, in place from the flat
//              buffer), each engine rank keeping its slice (copy_shard_from).
// A ~60M-parameter model (d 512, 8 layers, 8 heads, MLP 1536, vocabulary 32000; 240 MB
// in fp32). Args: trainer TP t, engines, engine TP e; a layout runs when t + engines·e
// is the world size (others are skipped). Run under mpirun, e.g.
//   mpirun -np 4 build/perf/bench_weight_sync    (t 2 -> 2 engines of 1; t 2 -> 1 engine of 2)
//   mpirun -np 6 build/perf/bench_weight_sync    (t 2 -> 1 engine of 4; t 2 -> 2 engines of 2)
// Counters (slowest rank, mean per sync): sliced_ms, broadcast_ms, broadcast_over_sliced
// (> 1: the sliced route is faster), and what one engine rank receives on each route
// (engine_rank_MB_sliced, engine_rank_MB_broadcast).
#include <ATen/ATen.h>

#include <memory>

#include "alternate.h"
#include "mpi_bench_main.h"
#include "model/transformer.h"
#include "parallel/mpi_comm.h"
#include "sync/fp8_weights.h"
#include "sync/weight_sync.h"
#include "sync/weight_sync_plan.h"
#include "sync/whole_model.h"

namespace slimpi::perf {
namespace {

ModelConfig bench_model() {
  ModelConfig c;
  c.vocab_size = 32000, c.hidden_size = 512, c.n_layers = 8, c.n_heads = 8, c.n_kv_heads = 8;
  c.intermediate_size = 1536, c.max_seq_len = 256;
  return c;
}

void BM_SlicedVsBroadcast(benchmark::State& state) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const SyncLayout layout{int(state.range(0)), 1, int(state.range(1)), int(state.range(2))};
  if (layout.n_members() != size) {
    state.SkipWithError("layout needs another world size");
    for (auto _ : state) {
    }
    return;
  }
  const ModelConfig cfg = bench_model();
  const bool trainer = rank < layout.n_trainer_members();
  const int t = layout.trainer_tensor, e = layout.engine_tensor;
  MPI_Comm group_mpi, bcast_mpi;
  MPI_Comm_split(MPI_COMM_WORLD, trainer ? 0 : 1 + (rank - t) / e, rank, &group_mpi);
  MPI_Comm_split(MPI_COMM_WORLD, rank == 0 || !trainer ? 0 : MPI_UNDEFINED, rank, &bcast_mpi);
  {
    MpiComm sync(MPI_COMM_WORLD, "sliced_sync"), group(group_mpi, "group");
    std::unique_ptr<MpiComm> bcast = bcast_mpi != MPI_COMM_NULL ? std::make_unique<MpiComm>(bcast_mpi, "sync") : nullptr;
    const int n = trainer ? t : e;
    Transformer mine(cfg, trainer ? 1 : 2, at::kCPU, at::kFloat, {}, {group.rank(), n, n > 1 ? &group : nullptr, false});
    // Trainer rank 0 of a split trainer: the gathered model; a tensor-parallel engine's rank: the staging copy.
    std::unique_ptr<Transformer> whole;
    if ((rank == 0 && t > 1) || (!trainer && e > 1)) whole = std::make_unique<Transformer>(cfg, 3, at::kCPU);
    SlicedWeightSync sliced(sync, cfg, layout, 256 << 20);
    std::unique_ptr<WeightSync> broadcast = bcast ? std::make_unique<WeightSync>(*bcast, 256 << 20) : nullptr;
    int64_t version = 1;
    auto run_sliced = [&] { sliced.sync(mine.parameters(), at::kFloat, &version, false); };
    auto run_broadcast = [&] {
      if (trainer && t > 1) gather_whole_model(mine, whole.get(), /*to_all=*/false);
      const Transformer& source = whole ? *whole : mine;  // one-rank engines receive in place
      if (broadcast) broadcast->sync(source.parameters(), &version, false, source.flat_parameters());
      if (!trainer && e > 1) mine.copy_shard_from(*whole);
    };
    run_sliced();  // warm-up, and the plan
    run_broadcast();
    const auto [sliced_s, broadcast_s] = alternate(state, [](auto fn) { return timed_max(fn); }, run_sliced,
                                                   run_broadcast);
    const double iters = double(state.iterations());
    int64_t received = 0;  // the first engine rank's share under the plan
    for (const auto& p : sliced.plan().pieces())
      if (p.dst == layout.n_trainer_members()) received += p.numel;
    state.counters["sliced_ms"] = 1e3 * sliced_s / iters;
    state.counters["broadcast_ms"] = 1e3 * broadcast_s / iters;
    state.counters["broadcast_over_sliced"] = broadcast_s / sliced_s;
    state.counters["engine_rank_MB_sliced"] = double(received) * 4 / (1 << 20);
    state.counters["engine_rank_MB_broadcast"] = double(cfg.n_params()) * 4 / (1 << 20);
  }
  MPI_Comm_free(&group_mpi);
  if (bcast_mpi != MPI_COMM_NULL) MPI_Comm_free(&bcast_mpi);
}
BENCHMARK(BM_SlicedVsBroadcast)
    ->Args({2, 2, 1})
    ->Args({2, 1, 2})
    ->Args({2, 1, 4})
    ->Args({2, 2, 2})
    ->Iterations(6)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// rollout.precision = "fp8" (sync/fp8_weights.h): where the quantisation runs, in one
// run at np 2 (trainer rank 0 -> one engine), on a model of shape arg 0 (0: bench_model
// above; 1: Qwen3-0.6B's: d 1024, 28 layers, 16 heads over 8 kv heads of 128, MLP 3072,
// vocabulary 151936, tied):
//   trainer side (built)  rank 0 quantises its fp32 masters into the fp8 image, sends it
//                         (e4m3 projections + scales + bf16 rest), the engine de-quantises
//   engine side           rank 0 sends bf16 (rounded from the masters), the engine
//                         quantises and de-quantises what it received
// Counters: trainer_side_ms, engine_side_ms, engine_over_trainer (> 1: the built side is
// cheaper), and the bytes each sends (fp8_MB, bf16_MB). Both give the engine FP8
// weights; the engine side quantises bf16-rounded values (not the masters), so its
// numbers differ slightly: the comparison is of cost.
ModelConfig qwen3_06b_shape() {
  ModelConfig c;
  c.vocab_size = 151936, c.hidden_size = 1024, c.n_layers = 28, c.n_heads = 16, c.n_kv_heads = 8;
  c.explicit_head_dim = 128, c.intermediate_size = 3072, c.max_seq_len = 256, c.tie_word_embeddings = true;
  c.qk_norm = true;
  return c;
}

void BM_Fp8TrainerVsEngineSide(benchmark::State& state) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    state.SkipWithError("runs at np 2");
    for (auto _ : state) {
    }
    return;
  }
  const ModelConfig cfg = state.range(0) == 1 ? qwen3_06b_shape() : bench_model();
  MpiComm comm(MPI_COMM_WORLD, "sync");
  WeightSync sync(comm, 256 << 20);
  const bool root = rank == 0;
  // Rank 0 the fp32 masters; the engine a bf16 model and its fp8 receive image.
  Transformer model(cfg, 1, at::kCPU, root ? at::kFloat : at::kBFloat16);
  WeightImage fp8 = fp8_weight_image(model, false);  // rank 0 fills and sends it, the engine receives into it
  std::unique_ptr<Transformer> staging;  // the engine side's bf16 copy as received
  if (!root) staging = std::make_unique<Transformer>(cfg, 2, at::kCPU, at::kBFloat16);
  int64_t version = 1, fp8_bytes = 0, bf16_bytes = 0;
  auto trainer_side = [&] {
    if (root) fill_fp8_image(model, fp8);
    fp8_bytes = sync.sync(fp8.params, &version, false, fp8.flat).bytes;
    if (!root) load_fp8_image(fp8, model);
  };
  auto engine_side = [&] {
    const WeightImage image = root ? weight_image(model, at::kBFloat16) : WeightImage{staging->flat_parameters(),
                                                                                      staging->parameters()};
    bf16_bytes = sync.sync(image.params, &version, false, image.flat).bytes;
    if (!root) copy_through_fp8(*staging, model);
  };
  trainer_side();  // warm-up
  engine_side();
  const auto [trainer_s, engine_s] = alternate(state, [](auto fn) { return timed_max(fn); }, trainer_side,
                                               engine_side);
  const double iters = double(state.iterations());
  state.counters["trainer_side_ms"] = 1e3 * trainer_s / iters;
  state.counters["engine_side_ms"] = 1e3 * engine_s / iters;
  state.counters["engine_over_trainer"] = engine_s / trainer_s;
  state.counters["fp8_MB"] = double(fp8_bytes) / (1 << 20);
  state.counters["bf16_MB"] = double(bf16_bytes) / (1 << 20);
}
BENCHMARK(BM_Fp8TrainerVsEngineSide)->Arg(0)->Arg(1)->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace slimpi::perf

int main(int argc, char** argv) { return slimpi::perf::run_mpi_benchmarks(argc, argv); }
