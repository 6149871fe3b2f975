// Trainer under pipeline parallelism (train/trainer.h; model/pipeline_shard.h): the 1F1B
// schedule of a step's micro-batches, the log-prob passes through the stages, the tied
// embedding's copies and the metrics every stage reports.
//
// 1F1B (Megatron's non-interleaved schedule) over M micro-batches at stage s of p: w =
// min(p − 1 − s, M) warm-up forwards, then M − w times a forward followed by the backward
// of the oldest micro-batch in flight, then w backwards. A stage holds at most w + 1
// micro-batches' activations (p at the first stage, however large M is). A forward takes
// the previous stage's output (the first stage the tokens), runs the stage's layers and
// sends its output on; the last stage runs the head and the loss instead. A backward
// takes the next stage's gradient of that output (the last stage its loss), runs
// autograd through the stage and sends the gradient of its input back.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>

#include <algorithm>
#include <deque>

#include "parallel/comm_tensor.h"
#include "train/micro_batches.h"
#include "train/packed_batch.h"
#include "train/pipeline_links.h"
#include "train/trainer.h"

namespace slimpi {
namespace {

// One micro-batch through this stage, in the forward's precision: its input (the tokens
// on the first stage; otherwise the previous stage's output, received into `received`,
// tracking gradients when `track_input`) -> the stage's output.
at::Tensor stage_forward(const Transformer& model, PipelineLinks& links, const PackedBatch& b, Precision precision,
                         bool track_input, at::Tensor* received = nullptr) {
  at::Tensor x = b.tokens;
  if (!model.pipeline_shard().first()) {
    x = links.recv_forward(model.stage_rows(b.seq_lens), model.config().hidden_size,
                           at::TensorOptions().dtype(at::kFloat).device(model.device()));
    if (track_input) x.set_requires_grad(true);
    if (received) *received = x;
  }
  ForwardPrecision scope(precision, model.device());
  return model.forward_packed_stage(x, b.seq_lens);
}

}  // namespace

void Trainer::pipelined_forwards_and_backwards(std::vector<Sample>& local,
                                               const std::vector<std::vector<int64_t>>& plan, const StepInputs& in,
                                               MetricSums& sums) {
  // Every stage of a pipeline holds the same samples, so the same plan.
  const int64_t M = int64_t(plan.size()), d = policy_.config().hidden_size;
  // The samples whose old log-probs this step's forward gives (Trainer::old_log_probs, on
  // the last stage): every stage keeps them (the first records rollouts.h5).
  std::vector<size_t> filled;
  if (cfg_.mode == "rl")
    for (size_t i = 0; i < local.size(); ++i)
      if (local[i].old_log_probs.empty()) filled.push_back(i);
  const at::Device device = policy_.device();
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  PipelineLinks links(pipeline_);
  struct InFlight {
    PackedBatch batch;
    at::Tensor input;   // [rows, d] the received activations (requires grad), undefined on the first stage
    at::Tensor output;  // the stage's output [rows, d], or the last stage's loss
  };
  std::deque<InFlight> in_flight;
  auto forward = [&](int64_t m) {
    InFlight f{pack(local, plan[size_t(m)], device), {}, {}};
    const at::Tensor y = stage_forward(policy_, links, f.batch, cfg_.precision, /*track_input=*/true, &f.input);
    if (pipeline_.last()) {
      const StageOutput stage{f.batch, y};
      f.output = micro_batch_loss(local, plan[size_t(m)], in, sums, &stage);
    } else {
      links.send_forward(y);
      f.output = y;
    }
    in_flight.push_back(std::move(f));
  };
  auto backward = [&] {
    InFlight f = std::move(in_flight.front());
    in_flight.pop_front();
    if (pipeline_.last()) f.output.backward();
    else f.output.backward(links.recv_backward(f.output.size(0), d, f32));
    if (!pipeline_.first()) links.send_backward(f.input.grad());
  };
  const int64_t warm_up = std::min<int64_t>(pipeline_.size - 1 - pipeline_.stage, M);
  for (int64_t m = 0; m < warm_up; ++m) forward(m);
  for (int64_t m = warm_up; m < M; ++m) {
    forward(m);
    backward();
  }
  while (!in_flight.empty()) backward();
  links.finish();
  pipeline_wait_s_ = links.waited_s();
  if (!filled.empty()) {
    int64_t n = 0;
    for (size_t i : filled) n += local[i].response_length();
    at::Tensor old = at::empty({n}, at::kFloat);  // [Σ R] the filled samples' old log-probs, back to back
    for (int64_t at = 0; size_t i : filled) {
      if (pipeline_.last()) std::copy(local[i].old_log_probs.begin(), local[i].old_log_probs.end(), old.data_ptr<float>() + at);
      at += local[i].response_length();
    }
    broadcast(*pipeline_.comm, old, pipeline_.size - 1);
    if (!pipeline_.last())
      for (int64_t at = 0; size_t i : filled) {
        local[i].old_log_probs.assign(old.data_ptr<float>() + at, old.data_ptr<float>() + at + local[i].response_length());
        at += local[i].response_length();
      }
  }
  for (const auto& g : groups_)
    SLIMPI_CHECK(g.grads->grads_alias_buffer(), "autograd replaced a gradient outside the flat gradient buffer");
}

std::vector<at::Tensor> Trainer::pipelined_log_probs(const std::vector<Sample>& samples,
                                                     const std::vector<std::vector<int64_t>>& plan,
                                                     const Transformer& model) const {
  // Every micro-batch's forward in turn on each stage (a stage starts the next as soon as
  // it has sent this one on), the last stage's log-probs broadcast once at the end.
  const PipelineShard& stage = model.pipeline_shard();
  const at::Device device = model.device();
  PipelineLinks links(stage);
  std::vector<at::Tensor> mine;  // the last stage's [N] per micro-batch
  std::vector<int64_t> sizes;
  for (const auto& which : plan) {
    const PackedBatch b = pack(samples, which, device);
    const at::Tensor y = stage_forward(model, links, b, cfg_.precision, /*track_input=*/false);
    int64_t n = 0;
    for (int64_t i : which) n += samples[size_t(i)].response_length();
    sizes.push_back(n);
    if (stage.last()) mine.push_back(head_token_log_probs(model, b, y, cfg_.precision, cfg_.temperature, false).logp.cpu());
    else links.send_forward(y);
  }
  links.finish();
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  at::Tensor all = stage.last() && !mine.empty() ? at::cat(mine) : at::empty({total}, at::kFloat);  // [Σ N]
  broadcast(*stage.comm, all, stage.size - 1);
  std::vector<at::Tensor> out;
  for (int64_t at = 0; int64_t n : sizes) {
    out.push_back(all.narrow(0, at, n));
    at += n;
  }
  return out;
}

void Trainer::sum_tied_embedding_grads() {
  // The first stage's embedding and the last stage's copy: each holds the part of the
  // gradient its own stage's use gave (lookup, head), summed here before the data-parallel
  // reduction, so both take the same step.
  if (!policy_.config().tie_word_embeddings || !pipeline_.tied) return;
  allreduce(*pipeline_.tied, policy_.parameter("model.embed_tokens.weight").grad());
}

void Trainer::share_last_stage_metrics(std::map<std::string, double>& metrics) const {
  // Only the last stage computed the loss terms; every stage declared the same names.
  std::vector<double> values;
  for (const auto& [name, v] : metrics) values.push_back(v);
  at::Tensor t = at::tensor(values, at::kDouble);
  broadcast(*pipeline_.comm, t, pipeline_.size - 1);
  size_t i = 0;
  for (auto& [name, v] : metrics) v = t[int64_t(i++)].item<double>();
}

}  // namespace slimpi
