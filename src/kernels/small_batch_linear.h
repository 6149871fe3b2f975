// The dense layers of a decode step on the host: y = x · Wᵀ (+ b) for the few rows that
// a decode or verify pass feeds each linear (one per running sequence), what llama.cpp's
// CPU matmul does for small batches.
//
// Why not at::linear: for up to 64 rows MKL's sgemm copies (packs) the whole weight
// matrix on every call, which reads and writes it once more than the product itself (65%
// of the samples of a Qwen3-0.6B-shaped decode at 8 sequences were that copy; perf/
// results/2026-12-03.md), and on AMD CPUs it runs its AVX2 code. Here the weights are
// read in place: a register tile of up to 8 rows of x by 3-8 rows of W (1-4 on x86-64-v3,
// whose 16 vector registers hold fewer accumulators; 8 floats a lane,
// all of a step's loads kept in registers), so that at up to 8 rows every weight is read
// from memory once and used by every row of x while in a register; more rows go in groups
// of 8 over chunks of k that stay in L1. The weight rows are split between the threads
// (at::parallel_for; this file is built with -fopenmp, src/CMakeLists.txt).
// perf/bench_engine's BM_SmallBatchLinear measures it against at::linear.
//
// Numbers: y[m, n] is one dot product whose order does not depend on the number of rows,
// the tile, the chunking or the thread (one 8-lane fp32 accumulator over k in order, its
// lanes summed in a fixed order, then the k tail): a row's output is the same whether it
// runs alone or among 64, and with any number of threads (tested). Compiled for
// x86-64-v4, -v3 (FMA) and plain x86-64, picked once from the CPU: the same lane order
// everywhere, so -v3 and -v4 give the same bits (tested); plain x86-64 rounds each
// product apart.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace slimpi {

// The most rows the kernel takes: a decode step of up to 64 running sequences, where the
// weights stream from memory (at 16, 32 and 64 rows it was 1.1-2.2x at::linear's GEMM on
// the 0.6B shape's 12.6 MB weights with 2 threads, 1.1-1.6x with one, over two runs;
// perf/results/2026-12-04.md). Past
// kSmallBatchLinearFewRows rows it takes only weights of kSmallBatchLinearLargeWeight
// bytes or more: a small weight stays in cache, the product is bound by arithmetic, and
// there the GEMM was faster (the quickstart's 176 KB weights, one thread: 0.67x at 32
// rows, 0.52x at 64; 0.79x at 16, where the kernel ran before this rule and still does).
// Larger batches (most prefill chunks) stay on the GEMM.
inline constexpr int64_t kSmallBatchLinearMaxRows = 64;
inline constexpr int64_t kSmallBatchLinearFewRows = 16;
inline constexpr int64_t kSmallBatchLinearLargeWeight = int64_t(4) << 20;

// True when dense() runs the kernel below: x and w fp32 on the CPU, w [N, K] contiguous,
// x [..., K] with at most kSmallBatchLinearFewRows rows (kSmallBatchLinearMaxRows for a
// weight of kSmallBatchLinearLargeWeight bytes or more), no autograd recording.
bool small_batch_linear_applies(const at::Tensor& x, const at::Tensor& w);

// Which compiled code runs: the best this CPU has, or one level (tests run each on a
// CPU that has it).
enum class SmallBatchLinearCode { Best, X86_64_V4, X86_64_V3, X86_64 };

// x [..., K] fp32 (any strides) with 1..kSmallBatchLinearMaxRows rows, w [N, K] fp32
// contiguous, bias [N] or undefined -> [..., N] fp32.
at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = {},
                              SmallBatchLinearCode code = SmallBatchLinearCode::Best);

// While one lives, dense() on this thread runs the kernel where it applies: the engine's
// incremental forwards (model/transformer.cpp) and its drafts. Elsewhere (training,
// log-prob recomputation, full recompute) dense() is at::linear, so the trainer's numbers
// never depend on the kernel, except under exact numerics (kernels/batch_invariant.h),
// where every dense() is batch_invariant_linear on both sides. Nests.
class SmallBatchLinearScope {
 public:
  SmallBatchLinearScope();
  ~SmallBatchLinearScope();
  SmallBatchLinearScope(const SmallBatchLinearScope&) = delete;
  SmallBatchLinearScope& operator=(const SmallBatchLinearScope&) = delete;

 private:
  bool previous_;
};

// Exact numerics' product: the kernel above for any number of rows (blocks of
// kSmallBatchLinearMaxRows), with 16 lanes for weights of K >= kBatchInvariantWideK
// (element k of a dot product into lane k mod 16, the lanes summed in one fixed tree,
// then the k tail in order; 512-bit FMAs on x86-64-v4, two 256-bit halves with the same
// bits on -v3) and the 8 lanes above for shorter ones (where the 16-lane sum cost more
// than the wider FMAs saved: the quickstart's K = 128 prefill ran 1.8x the default's
// against 1.5x, perf/results/2026-12-06.md). Each y[m, n] is the same dot product whatever
// rows share the call. Host tensors, x [..., K] fp32 or bf16 (widened: exact), w [N, K]
// fp32 or bf16, bias [N] fp32 or undefined -> [..., N] fp32; no autograd (dense() adds
// it). bf16 weights run 16 lanes at every K, each weight widened to fp32 in a register as
// it is loaded: from half the bytes, the bits of the 16-lane fp32 kernel on w.to(kFloat),
// which fp32 weights take only from K = kBatchInvariantWideK on (below it they take 8
// lanes, and the bits differ): both sides of a comparison must hold the weight in one dtype.
inline constexpr int64_t kBatchInvariantWideK = 512;
at::Tensor batch_invariant_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = {},
                                  SmallBatchLinearCode code = SmallBatchLinearCode::Best);

// Exact numerics' linear layer, differentiable: batch_invariant_linear's value with
// at::linear's gradients. `bf16`: as a bf16 forward's autocast linear computes it, with x,
// w and bias rounded to bf16 first, the sums in fp32 and the result rounded to bf16
// (y = bf16(x_b · w_bᵀ + b_b)); fp32 otherwise. dense() calls it with its autocast state;
// callers that know their precision (the trainer's log-prob head) call it directly.
at::Tensor exact_dense(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, bool bf16);

// at::linear(x, w, bias); inside a SmallBatchLinearScope the kernel above where it applies;
// in exact numerics (kernels/batch_invariant.h) exact_dense for every call, bf16 where
// autocast is on in bf16 (a bf16 forward), as at::linear would be.
at::Tensor dense(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = {});

}  // namespace slimpi
