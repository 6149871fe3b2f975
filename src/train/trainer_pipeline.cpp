// Trainer under pipeline parallelism (train/trainer.h; model/pipeline_shard.h): the 1F1B
// schedule of a step's micro-batches (train/pipeline_schedule.h), the log-prob passes
// through the stages, the embedding's copies and the metrics every stage reports.
// A forward takes the previous stage's output (the first stage the tokens), runs the
// stage's layers and sends its output on; the last stage runs the head and the loss
// instead. A backward takes the next stage's gradient of that output (the last stage its
// loss), runs autograd through the stage and sends the gradient of its input back.
// MoE models: each stage traces its own MoE layers (routing agreement, replay). The
// load-balancing loss couples the layers through their choice counts (model/moe.h): a
// forward adds its stage's counts to the sum it received and sends it on, so the last
// stage holds every layer's; that total travels back with the gradient, and each earlier
// stage adds its part of the router losses to its backward. With expert parallelism the
// pipelines of an expert group run as many micro-batches: past its own, a pipeline runs
// one-token idle ones (loss times zero) through every stage, so that each stage's token
// exchanges meet the group's.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>

#include "parallel/comm_tensor.h"
#include "train/micro_batches.h"
#include "train/moe_terms.h"
#include "train/packed_batch.h"
#include "train/pipeline_links.h"
#include "train/pipeline_schedule.h"
#include "train/trainer.h"

namespace slimpi {

void Trainer::pipelined_forwards_and_backwards(std::vector<Sample>& local,
                                               const std::vector<std::vector<int64_t>>& plan, const StepInputs& in,
                                               MetricSums& sums) {
  // Every stage of a pipeline holds the same samples, so the same plan; with expert
  // parallelism every pipeline of the group runs M micro-batches (idle ones past its own).
  const int64_t n_planned = int64_t(plan.size()), M = aligned_micro_batches(n_planned);
  const int64_t d = policy_.config().hidden_size;
  const int64_t k = policy_.config().n_experts_per_tok, E = policy_.config().n_experts;
  const bool sigmoid = policy_.config().moe_router == "sigmoid";
  // The samples whose old log-probs this step's forward gives (Trainer::old_log_probs, on
  // the last stage: those without, or every one when they came from the rollout): every
  // stage keeps them (the first records rollouts.h5).
  std::vector<size_t> filled;
  if (cfg_.mode == "rl")
    for (size_t i = 0; i < local.size(); ++i)
      if (local[i].old_log_probs.empty() || old_from_first_step_) filled.push_back(i);
  const at::Device device = policy_.device();
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  PipelineLinks links(pipeline_);
  struct InFlight {
    PackedBatch batch;
    bool idle = false;
    at::Tensor input;   // [rows, d] the received activations (requires grad), undefined on the first stage
    at::Tensor output;  // the stage's output [rows, d], or the last stage's loss
    MoeTrace trace;         // MoE: this stage's layers' routing
    StagedRouting routing;  // MoE: the choice counts of every stage (the last stage's from its forward)
  };
  auto forward = [&](int64_t m) {
    InFlight f;
    f.idle = m >= n_planned;
    f.batch = f.idle ? idle_batch(device) : pack(local, plan[size_t(m)], device);
    const bool traced = moe_ && !f.idle;
    at::Tensor rollout_routing;  // [T, L, k] the engine's experts, -1 where none
    if (traced) {
      rollout_routing = packed_routing(local, plan[size_t(m)], policy_.config(), device, cfg_.routing_replay);
      if (cfg_.routing_replay) f.trace.replay = rollout_routing;
    }
    const at::Tensor y = stage_forward(policy_, links, f.batch, cfg_.precision, /*track_input=*/true, &f.input,
                                       traced ? &f.trace : nullptr);
    if (traced) {
      const int64_t n_moe = int64_t(stage_moe_layers_.size());
      if (n_moe > 0)
        add_routing_agreement(f.trace, rollout_routing.narrow(1, stage_first_moe_, n_moe), stage_moe_layers_, sums);
      at::Tensor counts = moe_choice_counts(f.trace.router_logits, k, E, sigmoid);  // [k, E] f64
      if (!pipeline_.first()) counts = counts + links.recv_forward_counts(k, E);
      if (pipeline_.last()) f.routing = {counts, int64_t(moe_layers_.size())};
      else links.send_forward_counts(counts);
    }
    if (pipeline_.last()) {
      if (f.idle) {  // (an MoE MTP depth exchanges tokens too, in the forward's precision: as a real one's)
        ForwardPrecision scope(cfg_.precision, device);
        f.output = train_mtp_ && policy_.config().mtp_is_moe() ? idle_trunk_and_mtp(policy_, y) : y.sum() * 0.0;
      } else {
        const StageOutput stage{f.batch, y, traced ? &f.trace : nullptr, traced ? &f.routing : nullptr};
        f.output = micro_batch_loss(local, plan[size_t(m)], in, sums, &stage);
      }
    } else {
      links.send_forward(y);
      f.output = y;
    }
    return f;
  };
  auto backward = [&](InFlight& f) {
    const bool traced = moe_ && !f.idle;
    if (pipeline_.last()) {
      f.output.backward();
    } else {
      const at::Tensor grad = links.recv_backward(f.output.size(0), d, f32);
      at::Tensor router_loss;  // this stage's parts of the router losses (undefined: none)
      if (traced) {
        f.routing = {links.recv_backward_counts(k, E), int64_t(moe_layers_.size())};
        const double share = double(f.batch.tokens.size(0)) / in.n_tokens;
        router_loss = add_router_losses({}, f.trace, k, sigmoid, share, cfg_, sums, &f.routing);
      }
      if (router_loss.defined()) torch::autograd::backward({f.output, router_loss}, {grad, at::ones_like(router_loss)});
      else f.output.backward(grad);
    }
    if (!pipeline_.first()) {
      links.send_backward(f.input.grad());
      if (traced) links.send_backward_counts(f.routing.counts);
    }
  };
  run_one_f_one_b(pipeline_, M, forward, backward);
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
                                                     const Transformer& model, bool replay, int64_t n_runs) const {
  // Every micro-batch's forward in turn on each stage (a stage starts the next as soon as
  // it has sent this one on; idle ones past the plan), the last stage's log-probs
  // broadcast once at the end.
  const PipelineShard& stage = model.pipeline_shard();
  const at::Device device = model.device();
  PipelineLinks links(stage);
  std::vector<at::Tensor> mine;  // the last stage's [N] per planned micro-batch
  std::vector<int64_t> sizes;
  for (int64_t m = 0; m < n_runs; ++m) {
    const bool idle = m >= int64_t(plan.size());
    const PackedBatch b = idle ? idle_batch(device) : pack(samples, plan[size_t(m)], device);
    MoeTrace trace;  // train.routing_replay: the rollout's experts in every trainer forward
    if (replay && !idle) trace.replay = packed_routing(samples, plan[size_t(m)], model.config(), device, true);
    const at::Tensor y = stage_forward(model, links, b, cfg_.precision, /*track_input=*/false, nullptr,
                                       trace.replay.defined() ? &trace : nullptr);
    if (!stage.last()) links.send_forward(y);
    if (idle) continue;
    int64_t n = 0;
    for (int64_t i : plan[size_t(m)]) n += samples[size_t(i)].response_length();
    sizes.push_back(n);
    if (stage.last()) mine.push_back(head_token_log_probs(model, b, y, cfg_.precision, cfg_.temperature, false).logp.cpu());
  }
  links.finish();
  return from_last_stage(stage, mine, sizes);
}

void Trainer::sum_tied_embedding_grads() {
  // The first stage's embedding and the last stage's copy: each holds the part of the
  // gradient its own stage's use gave (lookup; a tied head, or 0 from the MTP layers'
  // detached read), summed here before the data-parallel reduction, so both take the same step.
  if (!last_stage_copies_embedding(policy_.config()) || !pipeline_.tied) return;
  allreduce(*pipeline_.tied, policy_.parameter("model.embed_tokens.weight").grad());
}

}  // namespace slimpi
