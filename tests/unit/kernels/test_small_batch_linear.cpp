// The decode-step dense kernel (kernels/small_batch_linear.h): equal to at::linear in fp64
// to fp32 round-off for every row count it takes and shapes with k and n tails; a row's
// output bit-identical whether it runs alone or among the most rows (batch invariance) and
// with one thread or three; dense() is at::linear outside a SmallBatchLinearScope and
// with autograd recording.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include "kernels/small_batch_linear.h"

namespace slimpi {
namespace {

at::Tensor randn(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return at::randn(shape, g, at::kFloat);
}

TEST(SmallBatchLinear, EqualsTheFp64ProductToRoundOff) {
  at::NoGradGuard no_grad;
  for (const auto& [K, N] : std::vector<std::pair<int64_t, int64_t>>{{64, 96}, {67, 7}, {1024, 1030}, {5, 3}}) {
    const at::Tensor w = randn({N, K}, 1), b = randn({N}, 2);
    for (int64_t M = 1; M <= kSmallBatchLinearMaxRows; ++M) {
      const at::Tensor x = randn({M, K}, 3 + uint64_t(M));
      const bool large = N * K * 4 >= kSmallBatchLinearLargeWeight;  // {1024, 1030}: 4.2 MB
      ASSERT_EQ(small_batch_linear_applies(x, w), M <= (large ? kSmallBatchLinearMaxRows : kSmallBatchLinearFewRows));
      const at::Tensor want = at::linear(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble));
      const at::Tensor got = small_batch_linear(x, w, b);
      ASSERT_EQ(got.sizes(), want.sizes());
      // fp32 dot products of K terms of size ~1: error ~ sqrt(K) * 2^-24 * |terms|.
      const double tol = 1e-6 * std::sqrt(double(K)) * 8;
      EXPECT_LT((got.to(at::kDouble) - want).abs().max().item<double>(), tol) << "M " << M << " K " << K << " N " << N;
    }
  }
}

TEST(SmallBatchLinear, ARowsOutputDoesNotDependOnTheBatch) {
  at::NoGradGuard no_grad;
  // K = 777: chunks of k (with more than 8 rows) and a tail of 1.
  const at::Tensor w = randn({300, 777}, 4);
  const at::Tensor x = randn({kSmallBatchLinearMaxRows, 777}, 5);
  const at::Tensor all = small_batch_linear(x, w);
  for (int64_t m = 0; m < x.size(0); ++m) {
    EXPECT_TRUE(at::equal(small_batch_linear(x.narrow(0, m, 1), w), all.narrow(0, m, 1))) << "row " << m << " alone";
    if (m + 3 <= x.size(0))
      EXPECT_TRUE(at::equal(small_batch_linear(x.narrow(0, m, 3), w), all.narrow(0, m, 3))) << "rows " << m << "..+3";
  }
}

TEST(SmallBatchLinear, TheOutputDoesNotDependOnTheThreads) {
  at::NoGradGuard no_grad;
  const at::Tensor w = randn({1000, 300}, 11);  // blocks of 3, 4 and 8 weight rows split unevenly
  const int threads = at::get_num_threads();
  for (const int64_t M : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{13}, kSmallBatchLinearMaxRows}) {
    const at::Tensor x = randn({M, 300}, 12 + uint64_t(M));
    at::set_num_threads(1);
    const at::Tensor one = small_batch_linear(x, w);
    at::set_num_threads(3);
    EXPECT_TRUE(at::equal(small_batch_linear(x, w), one)) << "M " << M;
  }
  at::set_num_threads(threads);
}

// The x86-64-v3 code (other tiles: 16 vector registers) gives the -v4 code's bits (same
// lane order, both FMA); the plain x86-64 code (no FMA) agrees to round-off. Each runs
// where this CPU has it.
TEST(SmallBatchLinear, EveryCompiledCodeAgrees) {
  at::NoGradGuard no_grad;
  __builtin_cpu_init();
  const at::Tensor w = randn({1000, 300}, 13);
  for (const int64_t M : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{8}, int64_t{13}, kSmallBatchLinearMaxRows}) {
    const at::Tensor x = randn({M, 300}, 14 + uint64_t(M));
    const at::Tensor plain = small_batch_linear(x, w, {}, SmallBatchLinearCode::X86_64);
    EXPECT_TRUE(at::allclose(plain, at::linear(x, w), 1e-4, 1e-4)) << "M " << M;
    if (!__builtin_cpu_supports("x86-64-v3")) continue;
    const at::Tensor v3 = small_batch_linear(x, w, {}, SmallBatchLinearCode::X86_64_V3);
    EXPECT_TRUE(at::allclose(v3, plain, 1e-4, 1e-4)) << "M " << M;
    if (__builtin_cpu_supports("x86-64-v4"))
      EXPECT_TRUE(at::equal(small_batch_linear(x, w, {}, SmallBatchLinearCode::X86_64_V4), v3)) << "M " << M;
  }
}

TEST(SmallBatchLinear, LeadingDimensionsAndStridesAreKept) {
  at::NoGradGuard no_grad;
  const at::Tensor w = randn({24, 40}, 6);
  const at::Tensor x = randn({40, 2, 3}, 7).permute({1, 2, 0});  // [2, 3, 40], not contiguous
  const at::Tensor got = small_batch_linear(x, w);
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, 3, 24}));
  EXPECT_TRUE(at::allclose(got, at::linear(x, w), 1e-5, 1e-5));
}

TEST(SmallBatchLinear, DenseIsAtLinearOutsideItsScopeAndUnderAutograd) {
  const at::Tensor w = randn({64, 48}, 8).requires_grad_(true);
  const at::Tensor x = randn({4, 48}, 9);
  {
    at::NoGradGuard no_grad;
    EXPECT_TRUE(at::equal(dense(x, w), at::linear(x, w)));  // no scope: at::linear, bit for bit
    const SmallBatchLinearScope scope;
    EXPECT_TRUE(at::equal(dense(x, w), small_batch_linear(x, w)));
    EXPECT_FALSE(small_batch_linear_applies(randn({kSmallBatchLinearFewRows + 1, 48}, 10), w));  // w: 12 KB
    const at::Tensor large = at::zeros({kSmallBatchLinearLargeWeight / 4 / 64, 64});
    EXPECT_TRUE(small_batch_linear_applies(at::zeros({kSmallBatchLinearMaxRows, 64}), large));
    EXPECT_FALSE(small_batch_linear_applies(at::zeros({kSmallBatchLinearMaxRows + 1, 64}), large));
    EXPECT_FALSE(small_batch_linear_applies(at::zeros({kSmallBatchLinearFewRows + 1, 64}), large.narrow(0, 1, 1000)));
    EXPECT_FALSE(small_batch_linear_applies(x.to(at::kBFloat16), w.to(at::kBFloat16)));
  }
  const SmallBatchLinearScope scope;
  const at::Tensor y = dense(x, w);  // recorded for autograd: at::linear
  EXPECT_TRUE(y.requires_grad());
  y.sum().backward();
  EXPECT_TRUE(w.grad().defined());
}

}  // namespace
}  // namespace slimpi
