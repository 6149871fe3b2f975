// Comm (MPI backend) allreduce and broadcast of 1-256 MB fp32 tensors against the raw
// MPI call on the same buffer, in the same run. Each iteration runs both, in
// alternating order, so that drift and noise hit both alike. Run under mpirun:
//   mpirun -np 2 build/perf/bench_comm
// Counters: comm_ms and mpi_ms (slowest rank, mean per call), comm_vs_mpi (mpi time /
// comm time: 1.0 = slimpi's path costs nothing over raw MPI).
// BM_GradientAllreduce/<MB>: the trainer's GradBuffer::all_reduce (32 MB buckets) of a
// ~10M-parameter model's gradients (40 MB) against one MPI_Allreduce of the same bytes.
// BM_WeightSyncBf16VsFp32: the sync of a bf16 rollout (rounding included) vs fp32.
// BM_OverlappedGradReduce/<bucket MB>: backward + gradient reduction, buckets reduced
// from inside backward vs after it (ratio overlap_over_after).
// BM_WeightSync/<bucket MB>/<in place>: WeightSync of the ~50M model (200 MB: header
// check, then buckets broadcast in place from the flat parameter buffer (1), or packed
// into a bucket buffer and unpacked into the receivers' parameters (0)) against one
// MPI_Bcast of the same bytes. Counter sync_vs_bcast.
#include <ATen/ATen.h>

#include "alternate.h"
#include "mpi_bench_main.h"
#include "parallel/comm_tensor.h"
#include "parallel/mpi_comm.h"
#include "sync/weight_sync.h"
#include "train/grad_buffer.h"

namespace slimpi::perf {
namespace {

constexpr int64_t kMB = 1 << 20;

template <class CommFn, class RawFn>
void compare(benchmark::State& state, CommFn via_comm, RawFn via_mpi) {
  MpiComm comm(MPI_COMM_WORLD, "bench");
  const int64_t mb = state.range(0);
  at::Tensor t = at::ones({mb * kMB / 4}, at::kFloat);  // [mb MB / 4], allocated once
  via_comm(comm, t);  // warm-up both paths
  via_mpi(t);
  const auto [comm_s, mpi_s] = alternate(state, [](auto fn) { return timed_max(fn); },
                                         [&] { via_comm(comm, t); }, [&] { via_mpi(t); });
  const double n = double(state.iterations());
  state.SetBytesProcessed(state.iterations() * mb * kMB);
  state.counters["comm_ms"] = 1e3 * comm_s / n;
  state.counters["mpi_ms"] = 1e3 * mpi_s / n;
  state.counters["comm_vs_mpi"] = mpi_s / comm_s;
}

void BM_Allreduce(benchmark::State& state) {
  compare(
      state, [](Comm& c, at::Tensor& t) { allreduce(c, t); },
      [](at::Tensor& t) {
        MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), static_cast<int>(t.numel()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      });
}

void BM_Broadcast(benchmark::State& state) {
  compare(
      state, [](Comm& c, at::Tensor& t) { broadcast(c, t, 0); },
      [](at::Tensor& t) { MPI_Bcast(t.data_ptr(), static_cast<int>(t.numel()), MPI_FLOAT, 0, MPI_COMM_WORLD); });
}

void BM_GradientAllreduce(benchmark::State& state) {
  MpiComm comm(MPI_COMM_WORLD, "trainer");
  ModelConfig c;  // the "10M" model of bench_train
  c.hidden_size = 320, c.n_layers = 8, c.n_heads = 8, c.n_kv_heads = 8, c.intermediate_size = 864;
  c.max_seq_len = 256;
  Transformer model(c, 1, at::kCPU);
  GradBuffer grads(model.parameters(), state.range(0) << 20);
  grads.flat().fill_(1.0f);
  at::Tensor raw = at::ones_like(grads.flat());  // the same bytes, for MPI_Allreduce
  auto via_mpi = [&] {
    MPI_Allreduce(MPI_IN_PLACE, raw.data_ptr(), static_cast<int>(raw.numel()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  };
  grads.all_reduce(&comm);
  via_mpi();
  double comm_s = 0, mpi_s = 0;
  for (auto _ : state) {
    double a = timed_max([&] { grads.all_reduce(&comm); });
    double b = timed_max(via_mpi);
    state.SetIterationTime(a);
    comm_s += a;
    mpi_s += b;
  }
  state.SetBytesProcessed(state.iterations() * grads.flat().numel() * 4);
  state.counters["MB"] = double(grads.flat().numel()) * 4 / (1 << 20);
  state.counters["buckets"] = double(grads.n_buckets());
  state.counters["grad_vs_mpi"] = mpi_s / comm_s;
}
BENCHMARK(BM_GradientAllreduce)->Arg(32)->Arg(8)->Iterations(10)->UseManualTime()->Unit(benchmark::kMillisecond);

// Backward + gradient reduction of the ~10M model (2 x 256 tokens per rank), with the
// buckets reduced from inside backward (GradBuffer::start_overlapped_reduction) or
// after it, alternating every iteration. Counter overlap_over_after = step time with
// overlap / without (< 1: the overlap pays).
void BM_OverlappedGradReduce(benchmark::State& state) {
  MpiComm comm(MPI_COMM_WORLD, "trainer");
  ModelConfig c;
  c.hidden_size = 320, c.n_layers = 8, c.n_heads = 8, c.n_kv_heads = 8, c.intermediate_size = 864;
  c.max_seq_len = 256;
  Transformer model(c, 1, at::kCPU);
  GradBuffer grads(model.parameters(), state.range(0) << 20);
  const at::Tensor tokens = at::remainder(at::arange(512, at::kLong) * 7919, c.vocab_size);  // [512]
  auto step = [&](bool overlap) {
    grads.zero();
    at::Tensor logits = model.forward_packed(tokens, {256, 256});  // [512, V]
    at::Tensor loss = at::log_softmax(logits, 1).select(1, 3).mean();
    if (overlap) grads.start_overlapped_reduction(&comm);
    loss.backward();
    grads.all_reduce(&comm);
  };
  step(true);
  step(false);
  const auto [overlap_s, after_s] =
      alternate(state, [](auto fn) { return timed_max(fn); }, [&] { step(true); }, [&] { step(false); });
  state.counters["buckets"] = double(grads.n_buckets());
  state.counters["in_backward"] = double(grads.n_started_in_backward());
  state.counters["overlap_ms"] = 1e3 * overlap_s / double(state.iterations());
  state.counters["after_ms"] = 1e3 * after_s / double(state.iterations());
  state.counters["overlap_over_after"] = overlap_s / after_s;
}
BENCHMARK(BM_OverlappedGradReduce)->Arg(8)->Arg(2)->Iterations(10)->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_WeightSync(benchmark::State& state) {
  MpiComm comm(MPI_COMM_WORLD, "sync");
  ModelConfig c;  // the "50M" model of bench_train
  c.hidden_size = 640, c.n_layers = 10, c.n_heads = 10, c.n_kv_heads = 10, c.intermediate_size = 1728;
  c.max_seq_len = 256;
  Transformer model(c, comm.rank() == 0 ? 1 : 2, at::kCPU);
  WeightSync sync(comm, state.range(0) << 20);
  const int64_t bytes = model.n_params() * 4;
  at::Tensor raw = at::zeros({bytes}, at::kByte);
  int64_t version = 1;
  // Arg 1: 1 = in place from the model's flat parameter buffer (what slimpi run does),
  // 0 = the packing path (models without one flat buffer).
  const at::Tensor flat = state.range(1) ? model.flat_parameters() : at::Tensor();
  sync.sync(model.parameters(), &version, false, flat);  // warm-up both paths
  MPI_Bcast(raw.data_ptr(), static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD);
  double sync_s = 0, bcast_s = 0;
  for (auto _ : state) {
    double a = timed_max([&] { sync.sync(model.parameters(), &version, false, flat); });
    double b = timed_max([&] { MPI_Bcast(raw.data_ptr(), static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD); });
    state.SetIterationTime(a);
    sync_s += a;
    bcast_s += b;
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["MB"] = double(bytes) / (1 << 20);
  state.counters["sync_GBps"] = double(bytes) * state.iterations() / sync_s / 1e9;
  state.counters["bcast_GBps"] = double(bytes) * state.iterations() / bcast_s / 1e9;
  state.counters["sync_vs_bcast"] = bcast_s / sync_s;
}
BENCHMARK(BM_WeightSync)
    ->Args({256, 1})
    ->Args({32, 1})
    ->Args({256, 0})
    ->Args({32, 0})
    ->Iterations(5)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The weight sync of a bf16 rollout (rank 0 rounds its fp32 masters to bf16, then the
// bf16 image is broadcast into the engines' bf16 models) against the fp32 sync, the
// ~50M model, 32 MB buckets, alternating. Counters bytes_bf16_over_fp32 and
// time_bf16_over_fp32 (the bf16 time includes the rounding).
void BM_WeightSyncBf16VsFp32(benchmark::State& state) {
  MpiComm comm(MPI_COMM_WORLD, "sync");
  ModelConfig c;
  c.hidden_size = 640, c.n_layers = 10, c.n_heads = 10, c.n_kv_heads = 10, c.intermediate_size = 1728;
  c.max_seq_len = 256;
  const bool root = comm.rank() == 0;
  Transformer masters(c, 1, at::kCPU), engine16(c, 2, at::kCPU, at::kBFloat16), engine32(c, 2, at::kCPU);
  WeightSync sync(comm, 32 << 20);
  int64_t version = 1;
  auto fp32 = [&] {
    Transformer& m = root ? masters : engine32;
    return sync.sync(m.parameters(), &version, false, m.flat_parameters());
  };
  auto bf16 = [&] {
    const WeightImage image = weight_image(root ? masters : engine16, at::kBFloat16);
    return sync.sync(image.params, &version, false, image.flat);
  };
  fp32();
  bf16();
  int64_t b32 = 0, b16 = 0;
  const auto [s16, s32] = alternate(state, [](auto fn) { return timed_max(fn); }, [&] { b16 = bf16().bytes; },
                                    [&] { b32 = fp32().bytes; });
  state.counters["MB_bf16"] = double(b16) / (1 << 20);
  state.counters["bytes_bf16_over_fp32"] = double(b16) / double(b32);
  state.counters["time_bf16_over_fp32"] = s16 / s32;
}
BENCHMARK(BM_WeightSyncBf16VsFp32)->Iterations(6)->UseManualTime()->Unit(benchmark::kMillisecond);

void sizes(benchmark::internal::Benchmark* b) {
  for (int64_t mb : {1, 4, 16, 64, 256}) b->Arg(mb);
  b->Iterations(10)->UseManualTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_Allreduce)->Apply(sizes);
BENCHMARK(BM_Broadcast)->Apply(sizes);

}  // namespace
}  // namespace slimpi::perf

int main(int argc, char** argv) { return slimpi::perf::run_mpi_benchmarks(argc, argv); }
