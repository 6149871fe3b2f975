// PipelineLinks — what a pipeline stage (model/pipeline_shard.h) passes to its neighbours:
// the residual stream [rows, d] fp32 forward to stage + 1, its gradient back to stage − 1,
// point to point over the pipeline group (an MPI communicator: tensors on a GPU travel
// through host copies). Sends are posted without blocking (parallel/posted_sends.h) and
// completed by finish(), so two neighbours sending to each other at once (1F1B's steady
// state) never wait on each other; receives wait asleep under the watchdog. Messages of
// one direction between two stages arrive in the order they were sent, so a schedule
// receives in the order its neighbour sends. An MoE model's router choice counts [k, E]
// f64 travel beside a micro-batch's activations (the sum over the stages so far) and its
// gradient (every stage's), as messages of their own.
// Owned by one schedule run; single-threaded.
#pragma once

#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <cstdint>
#include <string>

#include "model/pipeline_shard.h"
#include "parallel/posted_sends.h"

namespace slimpi {

class PipelineLinks {
 public:
  // stage.comm: the stage group, an MpiComm (rank = stage; ModelParallel makes it one).
  explicit PipelineLinks(const PipelineShard& stage);
  ~PipelineLinks();
  PipelineLinks(const PipelineLinks&) = delete;
  PipelineLinks& operator=(const PipelineLinks&) = delete;

  void send_forward(const at::Tensor& y);                                                 // to stage + 1
  at::Tensor recv_forward(int64_t rows, int64_t d, const at::TensorOptions& options);     // from stage − 1
  void send_backward(const at::Tensor& dx);                                               // to stage − 1
  at::Tensor recv_backward(int64_t rows, int64_t d, const at::TensorOptions& options);    // from stage + 1
  void send_forward_counts(const at::Tensor& counts);                                     // to stage + 1
  at::Tensor recv_forward_counts(int64_t k, int64_t n_experts);                           // from stage − 1
  void send_backward_counts(const at::Tensor& counts);                                    // to stage − 1
  at::Tensor recv_backward_counts(int64_t k, int64_t n_experts);                          // from stage + 1
  // Waits until every posted send has completed (call before the sent tensors' step ends).
  void finish();
  // Seconds this stage has spent waiting for its neighbours' messages (the pipeline's
  // bubble, as this stage sees it) and for its sends to complete.
  double waited_s() const { return waited_s_; }

 private:
  void send(const at::Tensor& t, int peer, int tag);
  at::Tensor recv(int64_t rows, int64_t d, const at::TensorOptions& options, int peer, int tag);

  PipelineShard stage_;
  MPI_Comm comm_;
  PostedSends sends_;
  double waited_s_ = 0;
};

}  // namespace slimpi
