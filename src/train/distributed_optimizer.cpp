#include "train/distributed_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>

#include <algorithm>

#include "parallel/comm.h"
#include "parallel/comm_tensor.h"

namespace slimpi {

DistributedAdamW::DistributedAdamW(GradBuffer& grads, Comm* group, const AdamWOptions& options)
    : grads_(grads), group_(group && group->size() > 1 ? group : nullptr), options_(options) {
  if (group_) {
    rank_ = group_->rank();
    size_ = group_->size();
  }
  buckets_ = grads.bucket_ranges();
  for (const auto& b : buckets_) {
    SLIMPI_CHECK(b.numel % size_ == 0, "distributed optimizer over {} ranks: a gradient bucket of {} elements "
                 "(buckets must be padded to a multiple of the group size)", size_, b.numel);
    local_offsets_.push_back(n_local_);
    n_local_ += b.numel / size_;
  }
  // Each parameter lies in one bucket; its part of this rank's chunk of that bucket.
  const auto& ranges = grads.param_ranges();
  size_t b = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    while (ranges[i].offset >= buckets_[b].offset + buckets_[b].numel) ++b;
    const int64_t begin = buckets_[b].offset + chunk(b) * rank_, end = begin + chunk(b);
    const int64_t lo = std::max(ranges[i].offset, begin), hi = std::min(ranges[i].offset + ranges[i].numel, end);
    if (lo < hi) segments_.push_back({i, b, lo - ranges[i].offset, hi - lo, local_offsets_[b] + (lo - begin)});
  }
  const at::TensorOptions fp32 = grads.flat().options();
  exp_avg_ = at::zeros({n_local_}, fp32);
  exp_avg_sq_ = at::zeros({n_local_}, fp32);
}

at::Tensor DistributedAdamW::own_chunk(size_t b) const {
  return grads_.flat().narrow(0, buckets_[b].offset + chunk(b) * rank_, chunk(b));
}

at::Tensor DistributedAdamW::segment_grad(const Segment& s) const {
  return own_chunk(s.bucket).narrow(0, s.local_offset - local_offsets_[s.bucket], s.length);
}

void DistributedAdamW::start_overlapped_reduce_scatter() {
  if (!group_) return;
  std::vector<at::Tensor> chunks;  // in place: each bucket's sums land in this rank's chunk of it
  for (size_t b = 0; b < buckets_.size(); ++b) chunks.push_back(own_chunk(b));
  grads_.start_overlapped_reduction(group_, std::move(chunks));
}

void DistributedAdamW::reduce_scatter() {
  if (!group_ || grads_.finish_reduction(group_)) return;  // one rank: its chunk is the bucket; or backward started them
  const at::Tensor& flat = grads_.flat();
  SLIMPI_CHECK(group_->device_memory() == flat.is_cuda(), "distributed optimizer: gradients on {} but comm '{}' "
               "works on {} memory", flat.is_cuda() ? "cuda" : "cpu", group_->name(),
               group_->device_memory() ? "device" : "host");
  for (size_t b = 0; b < buckets_.size(); ++b)
    group_->reduce_scatter(flat.narrow(0, buckets_[b].offset, buckets_[b].numel).data_ptr(), own_chunk(b).data_ptr(),
                           size_t(chunk(b)), DType::F32);
}

double DistributedAdamW::local_norm_sq() const {
  double sum = 0;  // fp64 (sum_of_squares_fp64), so a sharded norm agrees with an unsharded one
  for (size_t b = 0; b < buckets_.size(); ++b) sum += sum_of_squares_fp64(own_chunk(b));
  return sum;
}

void DistributedAdamW::clip(double norm, double max_norm) {
  if (max_norm <= 0 || norm <= max_norm) return;
  for (size_t b = 0; b < buckets_.size(); ++b) own_chunk(b).mul_(max_norm / (norm + 1e-6));
}

void DistributedAdamW::step(double lr, int64_t t) {
  at::NoGradGuard no_grad;
  const auto& params = grads_.params();
  for (const Segment& s : segments_) {
    const at::Tensor& p = params[s.param].tensor;
    at::Tensor m = exp_avg_.narrow(0, s.local_offset, s.length), v = exp_avg_sq_.narrow(0, s.local_offset, s.length);
    adamw_update(p.detach().view({-1}).narrow(0, s.param_offset, s.length), segment_grad(s), m, v, lr, t, options_,
                 p.dim() >= 2);
  }
  if (!group_) return;
  // Every bucket's values from the ranks that updated them, back into every parameter:
  // the gradient buffer, spent, carries them (each rank's updated values in its own
  // chunk, all-gathered in place), so no buffer of a bucket's size is allocated.
  const auto& ranges = grads_.param_ranges();
  const at::Tensor& flat = grads_.flat();
  size_t first_param = 0, next_segment = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (; next_segment < segments_.size() && segments_[next_segment].bucket == b; ++next_segment) {
      const Segment& s = segments_[next_segment];
      segment_grad(s).copy_(params[s.param].tensor.detach().view({-1}).narrow(0, s.param_offset, s.length));
    }
    const at::Tensor all = flat.narrow(0, buckets_[b].offset, buckets_[b].numel);
    group_->allgather(own_chunk(b).data_ptr(), all.data_ptr(), size_t(chunk(b)), DType::F32);
    for (size_t i = first_param; i < ranges.size() && ranges[i].offset < buckets_[b].offset + buckets_[b].numel; ++i) {
      params[i].tensor.detach().view({-1}).copy_(all.narrow(0, ranges[i].offset - buckets_[b].offset, ranges[i].numel));
      first_param = i + 1;
    }
  }
}

std::vector<TensorPiece> DistributedAdamW::moment_pieces() const {
  std::vector<TensorPiece> out;
  const auto& params = grads_.params();
  for (auto [prefix, moment] : {std::pair{"exp_avg/", &exp_avg_}, std::pair{"exp_avg_sq/", &exp_avg_sq_}})
    for (const Segment& s : segments_)
      out.push_back({prefix + params[s.param].name, params[s.param].tensor.sizes().vec(), s.param_offset,
                     moment->narrow(0, s.local_offset, s.length)});
  return out;
}

std::vector<NamedTensor> DistributedAdamW::state_like() const {
  // Shapes and dtypes only: meta tensors hold no storage.
  const at::TensorOptions fp32_meta = at::TensorOptions().dtype(at::kFloat).device(at::kMeta);
  std::vector<NamedTensor> out;
  for (const char* prefix : {"exp_avg/", "exp_avg_sq/"})
    for (const auto& p : grads_.params()) out.push_back({prefix + p.name, at::empty(p.tensor.sizes(), fp32_meta)});
  return out;
}

}  // namespace slimpi
