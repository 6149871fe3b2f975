#include "sync/whole_model.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/accumulate.h>
#include <slimpi/error.h>

#include <fmt/ranges.h>

#include <map>
#include <string>

#include "core/byte_codec.h"
#include "model/transformer.h"
#include "parallel/comm_tensor.h"
#include "train/expert_parallel.h"

namespace slimpi {
namespace {

// The tensor-parallel splits of `local` joined over the tensor group (replicated tensors
// as they are). to_all false: on the group's rank 0; the others get an empty list.
std::vector<NamedTensor> join_tensor_splits(const TensorShard& tp, const ModelConfig& cfg,
                                            const std::vector<NamedTensor>& local, bool to_all) {
  if (tp.size == 1) return local;
  std::vector<at::Tensor> flat;  // every split tensor flattened, back to back
  for (const auto& t : local) {
    if (!parameter_split(t.name, cfg, tp.size).split()) continue;
    SLIMPI_CHECK(t.tensor.scalar_type() == local.front().tensor.scalar_type(),
                 "joining tensor-parallel shards: {} is not of the first tensor's dtype", t.name);
    flat.push_back(t.tensor.detach().reshape({-1}));
  }
  const at::Tensor mine = flat.empty() ? at::empty({0}) : at::cat(flat);
  const at::Tensor all = to_all ? allgather(*tp.comm, mine) : gather_to_first(*tp.comm, mine);  // [t, n]
  if (!all.defined()) return {};
  std::vector<NamedTensor> out;
  int64_t offset = 0;
  for (const auto& t : local) {
    const ParameterSplit split = parameter_split(t.name, cfg, tp.size);
    if (!split.split()) {
      out.push_back(t);
      continue;
    }
    std::vector<int64_t> stacked_shape{tp.size};
    stacked_shape.insert(stacked_shape.end(), t.tensor.sizes().begin(), t.tensor.sizes().end());
    const int64_t n = t.tensor.numel();
    out.push_back({t.name, whole_of_shards(all.narrow(1, offset, n).reshape(stacked_shape), split)});
    offset += n;
  }
  return out;
}

// Pipeline parallelism: every stage's tensors (the last stage's copy of the embedding
// dropped), stage by stage: its names and shapes, then its values in one broadcast over the
// pipeline group. to_all false: on stage 0; the others get an empty list.
std::vector<NamedTensor> join_stages(const PipelineShard& pp, bool embedding_copy, const std::vector<NamedTensor>& local,
                                     bool to_all) {
  std::vector<NamedTensor> mine;
  for (const auto& t : local)
    if (!pp.is_embedding_copy(t.name, embedding_copy)) mine.push_back(t);
  const at::Device device = mine.empty() ? at::Device(at::kCPU) : mine.front().tensor.device();
  std::vector<NamedTensor> out;
  for (int s = 0; s < pp.size; ++s) {
    std::string meta;  // the dtype, then per tensor its name and its shape
    std::vector<at::Tensor> flat;
    if (pp.stage == s) {
      const at::ScalarType dtype = mine.empty() ? at::kFloat : mine.front().tensor.scalar_type();
      ByteWriter w;
      w.put<int32_t>(int32_t(dtype));
      w.put<uint64_t>(mine.size());
      for (const auto& t : mine) {
        SLIMPI_CHECK(t.tensor.scalar_type() == dtype, "joining pipeline stages: {} is not of the first tensor's dtype",
                     t.name);
        w.put_string(t.name);
        w.put_vector(t.tensor.sizes().vec());
        flat.push_back(t.tensor.detach().reshape({-1}));
      }
      meta = w.take();
    }
    broadcast_bytes(*pp.comm, meta, s);
    ByteReader in(meta);
    const auto dtype = at::ScalarType(in.get<int32_t>());
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes(in.get<uint64_t>());
    int64_t total = 0;
    for (auto& [name, shape] : shapes) {
      name = in.get_string();
      shape = in.get_vector<int64_t>();
      total += c10::multiply_integers(shape);
    }
    const auto opts = at::TensorOptions().dtype(dtype).device(device);
    at::Tensor values = pp.stage != s ? at::empty({total}, opts)
                        : flat.empty() ? at::empty({0}, opts)
                                       : at::cat(flat).contiguous();
    broadcast(*pp.comm, values, s);
    if (!to_all && pp.stage != 0) continue;
    int64_t offset = 0;
    for (const auto& [name, shape] : shapes) {
      const int64_t n = c10::multiply_integers(shape);
      out.push_back({name, values.narrow(0, offset, n).view(shape)});
      offset += n;
    }
  }
  return out;
}

}  // namespace

std::vector<NamedTensor> whole_tensors(const Transformer& shard_model, const std::vector<NamedTensor>& local,
                                       bool to_all) {
  const ExpertShard& ep = shard_model.expert_shard();
  std::vector<NamedTensor> joined = local;
  if (ep.size > 1) {
    std::vector<NamedTensor> experts;
    joined.clear();
    for (const auto& t : local) (Transformer::is_expert_parameter(t.name) ? experts : joined).push_back(t);
    for (auto& t : gather_expert_tensors(ep, ep.count(shard_model.config().n_experts), experts, to_all))
      joined.push_back(t);
    // The same decision on every rank of a tensor group (they share the data-parallel index).
    if (!to_all && ep.rank != 0) return {};
  }
  const TensorShard& tp = shard_model.tensor_shard();
  std::vector<NamedTensor> whole = join_tensor_splits(tp, shard_model.config(), joined, to_all);
  const PipelineShard& pp = shard_model.pipeline_shard();
  // (to_all false: the tensor groups' first ranks hold their stage's whole tensors; the
  // pipeline groups of the others hold no such rank, and they are done)
  if (pp.size == 1 || (!to_all && tp.rank != 0)) return whole;
  return join_stages(pp, last_stage_copies_embedding(shard_model.config()), whole, to_all);
}

namespace {

// Every parameter of `target` set to the tensor of its name (converted to its dtype).
void copy_by_name(const std::vector<NamedTensor>& tensors, Transformer& target) {
  std::map<std::string, at::Tensor> by_name;
  for (const auto& t : tensors) by_name[t.name] = t.tensor;
  at::NoGradGuard no_grad;
  for (const auto& p : target.parameters()) {
    auto it = by_name.find(p.name);
    SLIMPI_CHECK(it != by_name.end(), "gathering the model's shards: no rank holds {}", p.name);
    SLIMPI_CHECK(it->second.sizes() == p.tensor.sizes(), "gathering the model's shards: {} arrives as [{}] for a "
                 "tensor of [{}]", p.name, fmt::join(it->second.sizes(), ", "), fmt::join(p.tensor.sizes(), ", "));
    p.tensor.copy_(it->second);
  }
}

}  // namespace

void copy_tensor_shard(const Transformer& shard, Transformer& target) {
  SLIMPI_CHECK(target.tensor_shard().size == shard.tensor_shard().size &&
                   target.tensor_shard().rank == shard.tensor_shard().rank && target.expert_shard().size == 1,
               "copy_tensor_shard: the target must hold the same tensor shard ({} of {}) with every expert",
               shard.tensor_shard().rank, shard.tensor_shard().size);
  const ExpertShard& ep = shard.expert_shard();
  if (ep.size == 1) return target.copy_weights_from(shard);  // the same layout: one flat copy
  std::vector<NamedTensor> experts, tensors;
  for (const auto& t : shard.parameters()) (Transformer::is_expert_parameter(t.name) ? experts : tensors).push_back(t);
  for (auto& t : gather_expert_tensors(ep, ep.count(shard.config().n_experts), experts, /*to_all=*/true))
    tensors.push_back(std::move(t));
  copy_by_name(tensors, target);
}

void gather_whole_model(const Transformer& shard, Transformer* whole, bool to_all) {
  SLIMPI_CHECK(whole || !to_all, "gather_whole_model: every rank gathers, so every rank needs a whole model");
  const std::vector<NamedTensor> tensors = whole_tensors(shard, shard.parameters(), to_all);
  if (!whole || tensors.empty()) return;
  copy_by_name(tensors, *whole);
}

}  // namespace slimpi
