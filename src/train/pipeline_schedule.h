// The pieces of a pipeline stage's schedule that the policy's trainer, PPO's critic and a
// trainer-side teacher share (train/trainer_pipeline.cpp, train/critic.cpp,
// train/teacher_scores.cpp; model/pipeline_shard.h):
//  * 1F1B (Megatron's non-interleaved schedule) over M micro-batches at stage s of p:
//    w = min(p − 1 − s, M) warm-up forwards, then M − w times a forward followed by the
//    backward of the oldest micro-batch in flight, then w backwards. A stage holds at
//    most w + 1 micro-batches' activations (p at the first stage, however large M is);
//  * one micro-batch's forward through a stage (its input received from the previous
//    stage);
//  * the last stage's per-micro-batch results given to every stage, and a step's metrics
//    added up over the stages.
// Stateless functions; the caller owns the links, the schedule what is in flight.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "model/precision.h"
#include "model/transformer.h"
#include "train/packed_batch.h"
#include "train/pipeline_links.h"

namespace slimpi {

// Calls forward(m) for m = 0 .. M − 1, each returning what its backward needs (the
// micro-batch in flight), and backward(in_flight&) on each of those, oldest first, in 1F1B
// order for `stage`.
template <class Forward, class Backward>
void run_one_f_one_b(const PipelineShard& stage, int64_t M, Forward&& forward, Backward&& backward) {
  using InFlight = std::invoke_result_t<Forward&, int64_t>;
  std::deque<InFlight> in_flight;
  auto backward_oldest = [&] {
    InFlight f = std::move(in_flight.front());
    in_flight.pop_front();
    backward(f);
  };
  const int64_t warm_up = std::min<int64_t>(stage.size - 1 - stage.stage, M);
  for (int64_t m = 0; m < warm_up; ++m) in_flight.push_back(forward(m));
  for (int64_t m = warm_up; m < M; ++m) {
    in_flight.push_back(forward(m));
    backward_oldest();
  }
  while (!in_flight.empty()) backward_oldest();
}

// One micro-batch through this stage of `model`, in the forward's precision: its input
// (the tokens on the first stage; otherwise the previous stage's output, received into
// `received`, tracking gradients when `track_input`) -> the stage's output
// (Transformer::forward_packed_stage). moe: the stage's trace.
at::Tensor stage_forward(const Transformer& model, PipelineLinks& links, const PackedBatch& b, Precision precision,
                         bool track_input, at::Tensor* received = nullptr, MoeTrace* moe = nullptr);

// An idle micro-batch (expert parallelism, past a pipeline's own): the one token 0.
PackedBatch idle_batch(const at::Device& device);

// The last stage's results of each micro-batch (`mine`, there: [sizes[i], row...] of
// `dtype`; ignored elsewhere) on every stage, in one broadcast over the pipeline group,
// on the CPU. row: the shape of one result (empty: scalars).
std::vector<at::Tensor> from_last_stage(const PipelineShard& stage, const std::vector<at::Tensor>& mine,
                                        const std::vector<int64_t>& sizes, at::ScalarType dtype = at::kFloat,
                                        const std::vector<int64_t>& row = {});

// Each metric summed over the pipeline group (every stage holds the same names; a loss
// term's sums are 0 on the stages that do not compute it).
void sum_over_stages(const PipelineShard& stage, std::map<std::string, double>& metrics);

}  // namespace slimpi
