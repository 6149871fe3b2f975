#include "train/grad_buffer.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include "parallel/comm_tensor.h"

namespace slimpi {

GradBuffer::GradBuffer(const std::vector<NamedTensor>& params, int64_t bucket_bytes) : params_(params) {
  int64_t total = 0;
  for (const auto& p : params_) total += p.tensor.numel();
  SLIMPI_CHECK(!params_.empty(), "GradBuffer of no parameters");
  flat_ = at::zeros({total}, params_[0].tensor.options().dtype(at::kFloat).requires_grad(false));
  int64_t offset = 0;
  for (const auto& p : params_) {
    SLIMPI_CHECK(p.tensor.scalar_type() == at::kFloat, "GradBuffer: parameter {} is not fp32", p.name);
    views_.push_back(flat_.narrow(0, offset, p.tensor.numel()).view(p.tensor.sizes()));
    offset += p.tensor.numel();
  }
  bucket_elems_ = std::max<int64_t>(1, bucket_bytes / 4);
  zero();
}

void GradBuffer::zero() {
  flat_.zero_();
  for (size_t i = 0; i < params_.size(); ++i) params_[i].tensor.mutable_grad() = views_[i];
}

int64_t GradBuffer::n_buckets() const { return (flat_.numel() + bucket_elems_ - 1) / bucket_elems_; }

void GradBuffer::all_reduce(Comm* comm) {
  if (!comm || comm->size() == 1) return;
  for (int64_t start = 0; start < flat_.numel(); start += bucket_elems_) {
    at::Tensor bucket = flat_.narrow(0, start, std::min(bucket_elems_, flat_.numel() - start));
    allreduce(*comm, bucket, ReduceOp::Sum);
  }
}

double GradBuffer::global_norm() const { return flat_.norm().item<double>(); }

void GradBuffer::clip(double norm, double max_norm) {
  if (max_norm > 0 && norm > max_norm) flat_.mul_(max_norm / (norm + 1e-6));
}

bool GradBuffer::grads_alias_buffer() const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (!params_[i].tensor.grad().defined() || params_[i].tensor.grad().data_ptr() != views_[i].data_ptr())
      return false;
  return true;
}

}  // namespace slimpi
