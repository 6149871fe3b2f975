// The dense layers of a decode step on the host: y = x · Wᵀ (+ b) for the few rows that
// a decode or verify pass feeds each linear (one per running sequence), what llama.cpp's
// CPU matmul does for small batches.
//
// Why not at::linear: for 2..16 rows MKL's sgemm copies (packs) the whole weight matrix
// on every call, which reads and writes it once more than the product itself (65% of
// the samples of a Qwen3-0.6B-shaped decode at 8 sequences were that copy; perf/results/
// 2026-12-03.md). Here every weight row is read from memory once per call and dotted
// with all the rows of x: register tiles of 2 rows of x by 8 (then 4, then 1) rows of W,
// 8 floats a lane, k in chunks of 256 so that the weight rows' chunk and x's stay in L1.
// perf/bench_engine's BM_SmallBatchLinear measures it against at::linear.
//
// Numbers: y[m, n] is one dot product whose order does not depend on the number of rows,
// the tile, the chunking or the thread (one 8-lane fp32 accumulator over k in order, its
// lanes summed in a fixed order, then the k tail): a row's output is the same whether it
// runs alone or in a batch of 16 (tested). Compiled for x86-64-v4, -v3 (FMA) and plain
// x86-64, picked at load time: the same lane order everywhere, FMA rounding where the
// CPU has it.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace slimpi {

// The most rows the kernel takes. At 16 rows it and at::linear's GEMM were even on the
// 0.6B shape (0.98-1.10x, perf/bench_engine BM_SmallBatchLinear), so larger batches stay
// on the GEMM, whose arithmetic is the more efficient as rows grow; rows past 16 were not
// measured with this version of the kernel.
inline constexpr int64_t kSmallBatchLinearMaxRows = 16;

// True when dense() runs the kernel below: x and w fp32 on the CPU, w [N, K] contiguous,
// x [..., K] with at most kSmallBatchLinearMaxRows rows, no autograd recording.
bool small_batch_linear_applies(const at::Tensor& x, const at::Tensor& w);

// x [..., K] fp32 (any strides), w [N, K] fp32 contiguous, bias [N] or undefined ->
// [..., N] fp32. Requires small_batch_linear_applies(x, w).
at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = {});

// While one lives, dense() on this thread runs the kernel where it applies: the engine's
// incremental forwards (model/transformer.cpp) and its drafts. Elsewhere (training,
// log-prob recomputation, full recompute) dense() is at::linear, so the trainer's numbers
// never depend on the kernel. Nests.
class SmallBatchLinearScope {
 public:
  SmallBatchLinearScope();
  ~SmallBatchLinearScope();
  SmallBatchLinearScope(const SmallBatchLinearScope&) = delete;
  SmallBatchLinearScope& operator=(const SmallBatchLinearScope&) = delete;

 private:
  bool previous_;
};

// at::linear(x, w, bias); inside a SmallBatchLinearScope the kernel above where it applies.
at::Tensor dense(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = {});

}  // namespace slimpi
