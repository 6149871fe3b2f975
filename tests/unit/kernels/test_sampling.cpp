// The sampling rule's executors (host, tensor) against their reference twin; the
// counter RNG on uint64_t and on int64 tensors.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "kernels/counter_rng.h"
#include "kernels/sampling.h"
#include "kernels/sampling_tensor.h"

namespace slimpi {
namespace {

TEST(Sampling, KernelMatchesReferenceForEverySetting) {
  const int64_t rows = 64, vocab = 300;
  at::Generator g = at::detail::createCPUGenerator(9);
  at::Tensor logits = (at::randn({rows, vocab}, g) * 3).contiguous();
  // A few ties, which both must break towards the lower index.
  logits[0][10] = 50.0f;
  logits[0][20] = 50.0f;
  for (double temperature : {0.0, 0.7, 1.0, 1.3})
    for (int64_t top_k : {int64_t(0), int64_t(1), int64_t(5), int64_t(50), vocab + 5})
      for (double top_p : {1.0, 0.9, 0.5, 0.01}) {
        std::vector<SamplingRow> params;
        for (int64_t b = 0; b < rows; ++b)
          params.push_back({temperature, top_k, top_p, counter_uniform(42, uint64_t(b), uint64_t(top_k))});
        std::vector<int64_t> kernel(rows), reference(rows);
        std::vector<int32_t> kernel_support(rows), reference_support(rows);
        sample_tokens(logits.data_ptr<float>(), rows, vocab, params.data(), kernel.data(), kernel_support.data());
        sample_tokens_reference(logits.data_ptr<float>(), rows, vocab, params.data(), reference.data(),
                                reference_support.data());
        EXPECT_EQ(kernel, reference) << "T " << temperature << " top_k " << top_k << " top_p " << top_p;
        // The tensor executor (what a GPU runs), here on CPU, draws its uniforms itself.
        std::vector<DrawCoordinates> draws;
        for (int64_t b = 0; b < rows; ++b) draws.push_back({42, uint64_t(b), uint64_t(top_k)});
        SampledTokens on_tensors = sample_tokens_tensor(logits, params, draws);
        const std::vector<int64_t> tensor_tokens(on_tensors.tokens.data_ptr<int64_t>(),
                                                 on_tensors.tokens.data_ptr<int64_t>() + rows);
        const at::Tensor support32 = on_tensors.support.to(at::kInt).contiguous();
        const std::vector<int32_t> tensor_support(support32.data_ptr<int32_t>(), support32.data_ptr<int32_t>() + rows);
        EXPECT_EQ(tensor_tokens, kernel) << "T " << temperature << " top_k " << top_k << " top_p " << top_p;
        EXPECT_EQ(tensor_support, kernel_support) << "T " << temperature << " top_k " << top_k << " top_p " << top_p;
        EXPECT_EQ(kernel_support, reference_support) << "T " << temperature << " top_k " << top_k << " top_p " << top_p;
        for (int64_t b = 0; b < rows; ++b) {
          const bool cut = temperature > 0 && ((top_k > 0 && top_k < vocab) || top_p < 1.0);
          if (!cut) {
            EXPECT_EQ(kernel_support[b], 0);
            continue;
          }
          // The support is the `size` largest logits, and the sampled token is among them.
          ASSERT_GE(kernel_support[b], 1);
          if (top_k > 0) EXPECT_LE(kernel_support[b], top_k);
          const float z = logits[b][kernel[b]].item<float>();
          EXPECT_LT(logits[b].gt(z).sum().item<int64_t>(), kernel_support[b]) << "row " << b;
        }
        if (temperature == 0.0 || top_k == 1 || top_p == 0.01) {
          EXPECT_EQ(kernel[0], 10);  // greedy-like settings pick the lower of the tied maxima
          EXPECT_EQ(kernel[1], logits[1].argmax().item<int64_t>());
        }
      }
}

TEST(Sampling, FrequenciesFollowTheDistribution) {
  // 3 tokens with p = 0.5, 0.3, 0.2; top_k 2 renormalises to 0.625 / 0.375.
  std::vector<float> z{std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  const int n = 20000;
  std::vector<int> counts(3, 0), counts_k(3, 0);
  for (int i = 0; i < n; ++i) {
    SamplingRow r{1.0, 0, 1.0, counter_uniform(7, 0, uint64_t(i))};
    int64_t t;
    sample_tokens(z.data(), 1, 3, &r, &t);
    ++counts[t];
    r.top_k = 2;
    sample_tokens(z.data(), 1, 3, &r, &t);
    ++counts_k[t];
  }
  EXPECT_NEAR(counts[0] / double(n), 0.5, 0.015);
  EXPECT_NEAR(counts[1] / double(n), 0.3, 0.015);
  EXPECT_NEAR(counts[2] / double(n), 0.2, 0.015);
  EXPECT_NEAR(counts_k[0] / double(n), 0.625, 0.015);
  EXPECT_EQ(counts_k[2], 0);
}

TEST(Sampling, TensorExecutorMixesGreedyAndSampledRows) {
  at::Generator g = at::detail::createCPUGenerator(3);
  const at::Tensor logits = at::randn({6, 40}, g) * 2;
  std::vector<SamplingRow> params{{0.0, 0, 1.0}, {1.0, 0, 1.0}, {0.7, 3, 1.0},
                                  {1.0, 0, 0.6}, {0.0, 5, 0.5}, {1.3, 8, 0.8}};
  std::vector<DrawCoordinates> draws;
  for (size_t b = 0; b < params.size(); ++b) {
    draws.push_back({11, b, 2 * b});
    params[b].uniform = counter_uniform(11, b, 2 * b);
  }
  std::vector<int64_t> host(6);
  std::vector<int32_t> host_support(6);
  sample_tokens(logits.contiguous().data_ptr<float>(), 6, 40, params.data(), host.data(), host_support.data());
  SampledTokens t = sample_tokens_tensor(logits, params, draws);
  for (int64_t b = 0; b < 6; ++b) {
    EXPECT_EQ(t.tokens[b].item<int64_t>(), host[b]) << "row " << b;
    EXPECT_EQ(t.support[b].item<int64_t>(), host_support[b]) << "row " << b;
  }
}

TEST(CounterRng, TensorWordsGiveTheSameBits) {
  // Coordinates that exercise the sign bit and carries: the int64 tensor executor must
  // reproduce uint64_t arithmetic exactly.
  std::vector<DrawCoordinates> draws;
  for (uint64_t i = 0; i < 500; ++i)
    draws.push_back({mix_seed(i, 1, 2), i * 0x9e3779b97f4a7c15ULL, ~i});
  draws.push_back({~uint64_t(0), ~uint64_t(0), ~uint64_t(0)});
  draws.push_back({0, 0, 0});
  const at::Tensor u = counter_uniforms_tensor(draws, at::kCPU);
  for (size_t i = 0; i < draws.size(); ++i)
    ASSERT_EQ(u[int64_t(i)].item<double>(), counter_uniform(draws[i].seed, draws[i].sample, draws[i].position))
        << "draw " << i;
}

TEST(CounterRng, PureFunctionOfItsCoordinates) {
  EXPECT_EQ(counter_uniform(1, 2, 3), counter_uniform(1, 2, 3));
  EXPECT_NE(counter_uniform(1, 2, 3), counter_uniform(1, 2, 4));
  EXPECT_NE(counter_uniform(1, 2, 3), counter_uniform(1, 3, 3));
  EXPECT_NE(mix_seed(1, 2, 3), mix_seed(1, 3, 2));
  double sum = 0;
  for (uint64_t i = 0; i < 10000; ++i) {
    double u = counter_uniform(5, 0, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.01);
}

}  // namespace
}  // namespace slimpi
