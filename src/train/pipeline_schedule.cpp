#include "train/pipeline_schedule.h"

#include <ATen/ATen.h>

#include "parallel/comm_tensor.h"

namespace slimpi {

at::Tensor stage_forward(const Transformer& model, PipelineLinks& links, const PackedBatch& b, Precision precision,
                         bool track_input, at::Tensor* received, MoeTrace* moe) {
  at::Tensor x = b.tokens;
  if (!model.pipeline_shard().first()) {
    x = links.recv_forward(model.stage_rows(b.seq_lens), model.config().hidden_size,
                           at::TensorOptions().dtype(at::kFloat).device(model.device()));
    if (track_input) x.set_requires_grad(true);
    if (received) *received = x;
  }
  ForwardPrecision scope(precision, model.device());
  return model.forward_packed_stage(x, b.seq_lens, moe);
}

PackedBatch idle_batch(const at::Device& device) {
  PackedBatch b;
  b.tokens = at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(device));
  b.seq_lens = {1};
  b.prompt_lens = {1};
  return b;
}

std::vector<at::Tensor> from_last_stage(const PipelineShard& stage, const std::vector<at::Tensor>& mine,
                                        const std::vector<int64_t>& sizes, at::ScalarType dtype,
                                        const std::vector<int64_t>& row) {
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  std::vector<int64_t> shape{total};
  shape.insert(shape.end(), row.begin(), row.end());
  std::vector<at::Tensor> parts;
  if (stage.last())
    for (const auto& t : mine) parts.push_back(t.to(at::kCPU, dtype));
  at::Tensor all = stage.last() && !parts.empty() ? at::cat(parts) : at::empty(shape, dtype);  // [Σ n, row...]
  broadcast(*stage.comm, all, stage.size - 1);
  std::vector<at::Tensor> out;
  for (int64_t at = 0; int64_t n : sizes) {
    out.push_back(all.narrow(0, at, n));
    at += n;
  }
  return out;
}

void sum_over_stages(const PipelineShard& stage, std::map<std::string, double>& metrics) {
  std::vector<double> values;
  for (const auto& [name, v] : metrics) values.push_back(v);
  at::Tensor t = at::tensor(values, at::kDouble);
  allreduce(*stage.comm, t);
  size_t i = 0;
  for (auto& [name, v] : metrics) v = t[int64_t(i++)].item<double>();
}

}  // namespace slimpi
