// Checks the split-trainer tests share (test_context_parallel, test_pipeline_parallel): a
// trainer over a split model against the same step of the whole model. Each rank holds
// its part; `stored` places a shard's tensors in the whole ones (model/tensor_shard.h).
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "shared_tmp.h"
#include "model/transformer.h"
#include "train/trainer.h"
#include "../support/tensor_checks.h"
#include "../support/tiny_model.h"

namespace slimpi::testing {

// The split-trainer tests' MoE model: 4 experts, top-2, 16 wide, DeepSeekMoE routing (2
// groups, 1 kept) after a first dense layer (a pipeline stage of dense layers only).
inline void use_split_test_moe(ModelConfig& m) {
  m.n_experts = 4;
  m.n_experts_per_tok = 2;
  m.moe_intermediate_size = 16;
  m.moe_layer_freq = 1;
  use_deepseek_moe(m, /*n_group=*/2, /*topk_group=*/1, /*first_k_dense=*/1);
}

// A drawn routing trace for sample `i` of an MoE model: (tokens − 1) rows of k = 2
// distinct experts per MoE layer.
inline void add_routing_trace(Sample& s, const ModelConfig& cfg, int64_t i) {
  const int64_t len = int64_t(s.tokens.size());
  for (int64_t t = 0; t + 1 < len; ++t)
    for (int64_t l = 0; l < cfg.n_moe_layers(); ++l) {
      const int16_t first = int16_t((t + l + i) % cfg.n_experts);
      s.routing.push_back(first);
      s.routing.push_back(int16_t((first + 1 + t % (cfg.n_experts - 1)) % cfg.n_experts));
    }
}

// Every metric of `want` but the perf/ timings, within tol of its magnitude (at least 1).
inline void expect_metrics_near(const std::map<std::string, double>& got, const std::map<std::string, double>& want,
                                double tol, const std::string& what) {
  for (const auto& [k, x] : want) {
    if (k.rfind("perf/", 0) == 0) continue;
    EXPECT_NEAR(got.at(k), x, tol * std::max(1.0, std::abs(x))) << what << ": " << k;
  }
}

// The split model's gradients (unless the distributed optimizer holds them in its chunks)
// and updated weights against its parts of the whole model's; fp32 round-off, or with
// bf16 forwards a tenth of each tensor's largest entry (an ulp apart somewhere upstream).
inline void expect_shard_matches_whole(const Transformer& shard, const StoredWhole& stored,
                                       const std::map<std::string, at::Tensor>& want_grads,
                                       const std::map<std::string, at::Tensor>& want_weights, bool bf16,
                                       bool check_grads, const std::string& what) {
  for (const auto& p : shard.parameters()) {
    const at::Tensor grad = stored.part_of(p.name, want_grads.at(p.name));
    const at::Tensor weight = stored.part_of(p.name, want_weights.at(p.name));
    const double grad_atol = bf16 ? 0.1 * grad.abs().max().item<double>() + 1e-6 : 1e-6;
    const double weight_atol = bf16 ? 0.1 * weight.abs().max().item<double>() + 1e-6 : 1e-6;
    if (check_grads) expect_close(p.tensor.grad(), grad, what + ": gradient of " + p.name, bf16 ? 0.0 : 1e-4, grad_atol);
    expect_close(p.tensor.detach(), weight, what + ": updated " + p.name, bf16 ? 0.0 : 1e-4, weight_atol);
  }
}

// Layout-free checkpoints: `split`'s file (every rank writing its part) loads into a whole
// model of `cfg`, whose parts are each rank's own weights, bit for bit. Collective over
// the world.
inline void expect_checkpoint_loads_whole(const Trainer& split, const Transformer& shard, const ModelConfig& cfg,
                                          const StoredWhole& stored, TrainerConfig whole_tc, const std::string& what) {
  const SharedTmpDir scratch;
  const std::string path = scratch.file("split.h5");
  split.save(path, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  whole_tc.use_kl_loss = false;
  Transformer reread(cfg, 9, at::kCPU);
  Trainer again(whole_tc, reread, nullptr);
  again.load(path);
  for (const auto& p : shard.parameters())
    EXPECT_TRUE(at::equal(p.tensor.detach(), stored.part_of(p.name, reread.parameter(p.name).detach())))
        << what << ": loaded " << p.name;
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace slimpi::testing
