// GPU checks (ctest -L gpu; skipped where no GPU is visible). One GPU, so NCCL runs at
// one rank. The model's forward and backward on the GPU against the CPU (fp32 and
// bf16 tolerances); the tensor sampler on the GPU against the host sampler on the same
// logits; NCCL collectives at np 1; NCCL ordered after the compute that produces its
// input (a deliberately slow chain of products, and a backward), because it runs on
// torch's current stream.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include "core/gpu_info.h"
#include "kernels/counter_rng.h"
#include "kernels/sampling.h"
#include "kernels/sampling_tensor.h"
#include "model/precision.h"
#include "model/transformer.h"
#include "parallel/comm_tensor.h"
#include "parallel/nccl_comm.h"

namespace slimpi {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (visible_gpus().empty()) GTEST_SKIP() << "no GPU visible (" << cuda_description() << ")"

ModelConfig small_model() {
  ModelConfig c;
  c.vocab_size = 300, c.hidden_size = 128, c.n_layers = 3, c.n_heads = 4, c.n_kv_heads = 2;
  c.intermediate_size = 256, c.max_seq_len = 128, c.init_std = 0.1;
  return c;
}

double rel_max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.cpu().to(at::kDouble) - b.cpu().to(at::kDouble)).abs().max().item<double>() /
         std::max(b.abs().max().item<double>(), 1e-30);
}

TEST(Gpu, ForwardAndBackwardMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const at::Device gpu(at::kCUDA, 0);
  Transformer cpu_model(small_model(), 7, at::kCPU), gpu_model(small_model(), 7, gpu);
  at::Generator g = at::detail::createCPUGenerator(1);
  const at::Tensor tokens = at::randint(300, {150}, g, at::kLong);
  const std::vector<int64_t> lens{70, 50, 30};
  for (Precision p : {Precision::FP32, Precision::BF16}) {
    at::Tensor lc, lg;
    {
      ForwardPrecision a(p, at::kCPU);
      lc = cpu_model.forward_packed(tokens, lens);
    }
    {
      ForwardPrecision b(p, gpu);
      lg = gpu_model.forward_packed(tokens.to(gpu), lens);
    }
    const double tol = p == Precision::FP32 ? 1e-4 : 3e-2;
    EXPECT_LT(rel_max_diff(lg, lc), tol) << precision_name(p) << " logits";
    at::log_softmax(lc, 1).select(1, 5).sum().backward();
    at::log_softmax(lg, 1).select(1, 5).sum().backward();
    for (size_t i = 0; i < cpu_model.parameters().size(); ++i) {
      const auto& pc = cpu_model.parameters()[i].tensor;
      const auto& pg = gpu_model.parameters()[i].tensor;
      EXPECT_LT(rel_max_diff(pg.grad(), pc.grad()), p == Precision::FP32 ? 1e-3 : 5e-2)
          << precision_name(p) << " grad " << cpu_model.parameters()[i].name;
      pc.mutable_grad().reset();
      pg.mutable_grad().reset();
    }
  }
}

TEST(Gpu, TensorSamplerOnTheGpuEqualsTheHostSampler) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 64, vocab = 5000;
  at::Generator g = at::detail::createCPUGenerator(9);
  const at::Tensor logits = at::randn({rows, vocab}, g) * 3;  // [R, V] fp32
  int64_t compared = 0;
  for (double temperature : {0.0, 0.7, 1.0})
    for (int64_t top_k : {int64_t(0), int64_t(1), int64_t(50)})
      for (double top_p : {1.0, 0.9}) {
        std::vector<SamplingRow> params;
        std::vector<DrawCoordinates> draws;
        for (int64_t b = 0; b < rows; ++b) {
          draws.push_back({42, uint64_t(b), uint64_t(top_k)});
          params.push_back({temperature, top_k, top_p, counter_uniform(42, uint64_t(b), uint64_t(top_k))});
        }
        std::vector<int64_t> host(rows);
        std::vector<int32_t> host_support(rows);
        sample_tokens(logits.data_ptr<float>(), rows, vocab, params.data(), host.data(), host_support.data());
        SampledTokens dev = sample_tokens_tensor(logits.to(at::kCUDA), params, draws);
        EXPECT_TRUE(dev.tokens.is_cuda());
        const at::Tensor tokens = dev.tokens.cpu(), support = dev.support.cpu();
        for (int64_t b = 0; b < rows; ++b, ++compared) {
          EXPECT_EQ(tokens[b].item<int64_t>(), host[b]) << "T " << temperature << " k " << top_k << " p " << top_p;
          EXPECT_EQ(support[b].item<int64_t>(), host_support[b]);
        }
      }
  EXPECT_EQ(compared, 18 * rows);
  // The uniforms themselves: the int64-tensor RNG on the GPU gives uint64_t's bits.
  std::vector<DrawCoordinates> draws;
  for (uint64_t i = 0; i < 1000; ++i) draws.push_back({mix_seed(i, 3, 4), ~i, i * 0x9e3779b97f4a7c15ULL});
  const at::Tensor u = counter_uniforms_tensor(draws, at::Device(at::kCUDA, 0)).cpu();
  for (size_t i = 0; i < draws.size(); ++i)
    ASSERT_EQ(u[int64_t(i)].item<double>(), counter_uniform(draws[i].seed, draws[i].sample, draws[i].position));
}

TEST(Gpu, NcclCollectivesAtOneRank) {
  SKIP_WITHOUT_GPU();
  NcclComm comm(MPI_COMM_WORLD, "gpu-test", 0);
  ASSERT_EQ(comm.size(), 1);
  at::Tensor t = at::arange(1000, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
  allreduce(comm, t);
  broadcast(comm, t, 0);
  EXPECT_TRUE(at::equal(t.cpu(), at::arange(1000, at::kFloat)));
  at::Tensor b = t.to(at::kBFloat16);
  allreduce(comm, b);
  EXPECT_TRUE(at::equal(b.cpu(), at::arange(1000, at::kFloat).to(at::kBFloat16)));
  at::Tensor all = allgather(comm, t);
  EXPECT_TRUE(at::equal(all[0].cpu(), t.cpu()));
}

TEST(Gpu, NcclRunsAfterTheComputeThatProducesItsInput) {
  SKIP_WITHOUT_GPU();
  NcclComm comm(MPI_COMM_WORLD, "gpu-test", 0);
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  // A slow chain on torch's current stream (~tens of ms), its result sent at once:
  // out-of-place allgather copies `send`, so a NCCL that did not wait would copy
  // memory the chain had not written yet.
  at::Tensor a = at::randn({4096, 4096}, opts), m = at::randn({4096, 4096}, opts) / 64.0;
  for (int i = 0; i < 40; ++i) a = at::matmul(a, m).tanh();
  at::Tensor send = a.sum(0);  // [4096], written by the last kernel of the chain
  at::Tensor recv = at::empty({1, 4096}, opts);
  comm.allgather(send.data_ptr(), recv.data_ptr(), 4096, DType::F32);
  EXPECT_TRUE(at::equal(recv[0], send));
  // A slow backward: its gradient goes straight into the collective.
  Transformer model(small_model(), 3, at::Device(at::kCUDA, 0));
  at::Tensor tokens = at::randint(300, {512}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
  at::log_softmax(model.forward_packed(tokens, {128, 128, 128, 128}), 1).select(1, 1).sum().backward();
  const at::Tensor& grad = model.parameters().back().tensor.grad();
  at::Tensor grad_recv = at::empty({1, grad.numel()}, opts);
  comm.allgather(grad.data_ptr(), grad_recv.data_ptr(), static_cast<size_t>(grad.numel()), DType::F32);
  EXPECT_TRUE(at::equal(grad_recv[0], grad.reshape({-1})));
}

}  // namespace
}  // namespace slimpi
