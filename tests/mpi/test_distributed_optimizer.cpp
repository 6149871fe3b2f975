// The distributed optimizer (train/distributed_optimizer.h) at np 1, 2, 3 and 4: a
// data-parallel trainer with the AdamW moments sharded over its ranks takes the steps
// of the same trainer with whole moments — parameters after every step, metrics and the
// gradient norm equal to fp32 round-off (reduce-scatter and all-reduce may sum in
// different orders), with buckets small enough that shards cut through parameters and
// sizes not divisible by the group (d = 3); each rank holds only 1/d of the moments;
// its checkpoint holds the whole moments, equal to the plain trainer's; and a plain
// checkpoint loaded into a sharded trainer continues as the plain trainer does. The
// reduce-scatters start from inside backward (train.overlap_grad_reduce) or after it:
// the same steps either way.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "shared_tmp.h"
#include "io/h5.h"
#include "io/tensor_io.h"
#include "parallel/mpi_comm.h"
#include "train/trainer.h"
#include "../support/tensor_checks.h"
#include "../support/tiny_model.h"

namespace slimpi {
namespace {

ModelConfig odd_config() {
  ModelConfig c = testing::tiny_model_config(/*max_seq_len=*/32, /*init_std=*/0.1);
  c.hidden_size = 20;  // 5 heads of 4: no tensor of the model divides into 3 or 4 equal parts by rows
  c.n_heads = 5;
  c.n_kv_heads = 1;
  c.intermediate_size = 37;
  c.vocab_size = 259;
  c.qkv_bias = true;
  return c;
}

TrainerConfig rl_config(bool distributed, bool overlap = true) {
  TrainerConfig c;
  c.mode = "rl";
  c.entropy_coef = 0.01;
  c.normalize_advantages = true;
  c.n_micro_batches = 2;
  c.clip_grad = 0.5;
  c.lr.lr = 1e-2;
  c.adam.eps = 1e-3;
  c.adam.weight_decay = 0.1;  // matrices decay, vectors do not: per segment
  c.grad_bucket_bytes = 1 << 12;  // buckets of ~1k elements: shards cut through parameters
  c.distributed_optimizer = distributed;
  c.overlap_grad_reduce = overlap;
  return c;
}

std::vector<Sample> samples_of(int r, int step) {
  at::Generator g = at::detail::createCPUGenerator(uint64_t(700 + 10 * r + step));
  std::vector<Sample> out;
  for (int i = 0; i < 2 + r % 2; ++i) {
    Sample s;
    const int64_t len = 6 + at::randint(10, {1}, g, at::kLong).item<int64_t>();
    at::Tensor t = at::randint(258, {len}, g, at::kLong);
    s.tokens.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + len);
    s.prompt_length = 2 + i % 3;
    s.reward = at::randn({1}, g).item<float>();
    out.push_back(s);
  }
  return out;
}

// This file's tolerance: the two optimizers' parameters after each step.
void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what, double rtol = 1e-5,
                  double atol = 1e-7) {
  testing::expect_close(got, want, what, rtol, atol);
}

TEST(DistributedOptimizer, StepsEqualPlainAdamW) {
  MpiComm world(MPI_COMM_WORLD, "trainer");
  const int r = world.rank(), n = world.size();
  Transformer plain_model(odd_config(), 1, at::kCPU), sharded_model(odd_config(), 1, at::kCPU),
      after_model(odd_config(), 1, at::kCPU);
  Trainer plain(rl_config(false), plain_model, &world);
  Trainer sharded(rl_config(true), sharded_model, &world);
  Trainer after(rl_config(true, /*overlap=*/false), after_model, &world);  // reduce-scatters after backward
  ASSERT_GT(sharded.grads().n_buckets(), 4);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<Sample> a = samples_of(r, step), b = samples_of(r, step), c = samples_of(r, step);
    plain.prepare_rollout(a, false);
    sharded.prepare_rollout(b, false);
    after.prepare_rollout(c, false);
    const auto want = plain.train_step(a);
    const auto got = sharded.train_step(b);
    const auto got_after = after.train_step(c);
    for (const auto& [k, x] : want)
      if (k.rfind("perf/", 0) != 0) {
        EXPECT_NEAR(got.at(k), x, 1e-5 * std::max(1.0, std::abs(x))) << k;
        EXPECT_NEAR(got_after.at(k), x, 1e-5 * std::max(1.0, std::abs(x))) << k << " (after backward)";
      }
    EXPECT_GT(want.at("train/grad_norm"), 0.5);  // the clip acted: the norm of every shard together
    // Overlapped: most buckets went out while backward still ran (the first ones' gradients come last).
    if (n > 1) EXPECT_GT(sharded.grads().n_started_in_backward(), sharded.grads().n_buckets() / 2);
    EXPECT_EQ(after.grads().n_started_in_backward(), 0);
    for (size_t i = 0; i < plain_model.parameters().size(); ++i) {
      expect_close(sharded_model.parameters()[i].tensor.detach(), plain_model.parameters()[i].tensor.detach(),
                   "parameter " + plain_model.parameters()[i].name);
      expect_close(after_model.parameters()[i].tensor.detach(), plain_model.parameters()[i].tensor.detach(),
                   "parameter (after backward) " + plain_model.parameters()[i].name);
    }
  }
  EXPECT_EQ(sharded.n_steps(), 3);

  // The checkpoint holds whole moments, the plain trainer's.
  const testing::SharedTmpDir scratch;  // its own: np variants and reruns may run at once
  const std::string& dir = scratch.path();
  world.barrier();
  if (r == 0) plain.save(dir + "/plain.h5");
  sharded.save(dir + "/sharded.h5", MPI_COMM_WORLD);  // every rank writes its chunks of the moments
  world.barrier();
  if (r == 0) {
    h5::File a = h5::File::open(dir + "/plain.h5", false, MPI_COMM_NULL);
    h5::File b = h5::File::open(dir + "/sharded.h5", false, MPI_COMM_NULL);
    h5::Handle oa = h5::open_group(a.id(), "optimizer"), ob = h5::open_group(b.id(), "optimizer");
    EXPECT_EQ(h5::read_attr_int(ob.id(), "n_steps"), 3);
    for (const auto& p : plain_model.parameters())
      for (const std::string moment : {"exp_avg/", "exp_avg_sq/"})
        // atol: the gradients are summed in another order (reduce-scatter vs all-reduce),
        // an error of eps·Σ|g| however small the sum; 1e-9 failed by 6e-9 at np 3 on one CPU.
        expect_close(read_tensor(ob.id(), moment + p.name), read_tensor(oa.id(), moment + p.name),
                     "stored " + moment + p.name, 1e-4, 1e-8);
  }
  // The plain checkpoint into a sharded trainer: the next step is the plain trainer's.
  Transformer resumed_model(odd_config(), 5, at::kCPU);
  Trainer resumed(rl_config(true), resumed_model, &world);
  resumed.load(dir + "/plain.h5");
  EXPECT_EQ(resumed.n_steps(), 3);
  std::vector<Sample> a = samples_of(r, 3), b = samples_of(r, 3);
  plain.prepare_rollout(a, false);
  resumed.prepare_rollout(b, false);
  plain.train_step(a);
  resumed.train_step(b);
  for (size_t i = 0; i < plain_model.parameters().size(); ++i)
    expect_close(resumed_model.parameters()[i].tensor.detach(), plain_model.parameters()[i].tensor.detach(),
                 "resumed " + plain_model.parameters()[i].name);
  world.barrier();
}

TEST(DistributedOptimizer, EachRankHoldsItsChunks) {
  MpiComm world(MPI_COMM_WORLD, "trainer");
  const int n = world.size();
  Transformer model(odd_config(), 1, at::kCPU);
  GradBuffer grads(model.parameters(), 1 << 12, n);
  for (const auto& b : grads.bucket_ranges()) EXPECT_EQ(b.numel % n, 0);
  DistributedAdamW opt(grads, &world, {});
  EXPECT_EQ(opt.n_local(), grads.flat().numel() / n);
  EXPECT_LE(opt.n_local() * n, model.n_params() + int64_t(grads.n_buckets()) * n);  // padding below d a bucket
}

}  // namespace
}  // namespace slimpi
