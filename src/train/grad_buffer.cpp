#include "train/grad_buffer.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>

#include "parallel/comm_tensor.h"

namespace slimpi {

// Runs after autograd has accumulated one parameter's gradient into its .grad.
class GradBuffer::Hook final : public torch::autograd::PostAccumulateGradHook {
 public:
  Hook(GradBuffer* owner, size_t index) : owner_(owner), index_(index) {}
  void operator()(const torch::autograd::Variable&) override { owner_->on_accumulated(index_); }

 private:
  GradBuffer* owner_;
  size_t index_;
};

GradBuffer::GradBuffer(const std::vector<NamedTensor>& params, int64_t bucket_bytes, int64_t pad_buckets_to)
    : params_(params) {
  SLIMPI_CHECK(!params_.empty(), "GradBuffer of no parameters");
  SLIMPI_CHECK(pad_buckets_to >= 1, "GradBuffer: buckets padded to multiples of {}", pad_buckets_to);
  // The layout first (buckets of whole parameters, each padded), then the storage.
  const int64_t bucket_elems = std::max<int64_t>(1, bucket_bytes / 4);
  auto pad = [&](Bucket& b) { b.numel = (b.numel + pad_buckets_to - 1) / pad_buckets_to * pad_buckets_to; };
  int64_t offset = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    SLIMPI_CHECK(p.tensor.scalar_type() == at::kFloat, "GradBuffer: parameter {} is not fp32", p.name);
    if (buckets_.empty() || buckets_.back().numel >= bucket_elems) {
      if (!buckets_.empty()) {
        pad(buckets_.back());
        offset = buckets_.back().offset + buckets_.back().numel;
      }
      buckets_.push_back({offset, 0, 0, 0, nullptr});
    }
    param_ranges_.push_back({offset, p.tensor.numel()});
    buckets_.back().numel += p.tensor.numel();
    ++buckets_.back().n_params;
    bucket_of_.push_back(static_cast<int64_t>(buckets_.size()) - 1);
    offset += p.tensor.numel();
  }
  pad(buckets_.back());
  const int64_t total = buckets_.back().offset + buckets_.back().numel;
  flat_ = at::zeros({total}, params_[0].tensor.options().dtype(at::kFloat).requires_grad(false));
  for (size_t i = 0; i < params_.size(); ++i)
    views_.push_back(flat_.narrow(0, param_ranges_[i].offset, param_ranges_[i].numel).view(params_[i].tensor.sizes()));
  for (size_t i = 0; i < params_.size(); ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(params_[i].tensor, std::make_unique<Hook>(this, i));
  zero();
}

GradBuffer::~GradBuffer() {
  for (auto& b : buckets_) b.pending.reset();  // waits
  for (auto& p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p.tensor, nullptr);
}

void GradBuffer::zero() {
  flat_.zero_();
  for (size_t i = 0; i < params_.size(); ++i) params_[i].tensor.mutable_grad() = views_[i];
}

void GradBuffer::start_overlapped_reduction(Comm* comm, std::vector<at::Tensor> scatter_into) {
  if (!comm || comm->size() == 1) return;
  SLIMPI_CHECK(!armed_, "GradBuffer: an overlapped reduction is already in progress");
  SLIMPI_CHECK(scatter_into.empty() || int64_t(scatter_into.size()) == n_buckets(),
               "GradBuffer: {} reduce-scatter targets for {} buckets", scatter_into.size(), n_buckets());
  for (size_t b = 0; b < scatter_into.size(); ++b)
    SLIMPI_CHECK(scatter_into[b].numel() * comm->size() == buckets_[b].numel && scatter_into[b].is_contiguous(),
                 "GradBuffer: bucket {} of {} elements reduce-scattered over {} ranks into {}", b, buckets_[b].numel,
                 comm->size(), scatter_into[b].numel());
  scatter_into_ = std::move(scatter_into);
  for (auto& b : buckets_) b.n_ready = 0;
  armed_ = comm;
  next_to_start_ = n_buckets() - 1;
  started_in_backward_ = 0;
}

void GradBuffer::on_accumulated(size_t param_index) {
  if (!armed_) return;
  Bucket& b = buckets_[bucket_of_[param_index]];
  ++b.n_ready;
  const int64_t before = next_to_start_;
  start_ready_buckets(/*all=*/false);
  started_in_backward_ += before - next_to_start_;
  for (auto& other : buckets_)  // MPI progresses inside MPI calls: give it some
    if (other.pending) other.pending->test();
}

void GradBuffer::start(Bucket& bucket) {
  at::Tensor range = flat_.narrow(0, bucket.offset, bucket.numel);
  SLIMPI_CHECK(armed_->device_memory() == range.is_cuda(),
               "GradBuffer: gradients on {} but comm '{}' ({}) works on {} memory", range.is_cuda() ? "cuda" : "cpu",
               armed_->name(), armed_->backend(), armed_->device_memory() ? "device" : "host");
  if (scatter_into_.empty()) {
    bucket.pending = armed_->iallreduce(range.data_ptr(), static_cast<size_t>(bucket.numel), DType::F32,
                                        ReduceOp::Sum);
    return;
  }
  const at::Tensor& chunk = scatter_into_[size_t(&bucket - buckets_.data())];
  bucket.pending = armed_->ireduce_scatter(range.data_ptr(), chunk.data_ptr(), size_t(chunk.numel()), DType::F32);
}

// Starts buckets in order from next_to_start_ down, while they are complete (or all).
void GradBuffer::start_ready_buckets(bool all) {
  while (next_to_start_ >= 0) {
    Bucket& b = buckets_[next_to_start_];
    if (!all && b.n_ready < b.n_params) break;
    start(b);
    --next_to_start_;
  }
}

bool GradBuffer::finish_reduction(Comm* comm) {
  if (!armed_) return false;
  SLIMPI_CHECK(armed_ == comm, "GradBuffer: reduction armed on comm '{}' but finished on '{}'", armed_->name(),
               comm ? comm->name() : std::string("none"));
  start_ready_buckets(/*all=*/true);
  for (auto& b : buckets_) {
    b.pending->wait();
    b.pending.reset();
  }
  armed_ = nullptr;
  scatter_into_.clear();
  return true;
}

void GradBuffer::all_reduce(Comm* comm) {
  if (!comm || comm->size() == 1) return;
  SLIMPI_CHECK(!armed_ || scatter_into_.empty(), "GradBuffer: a reduce-scatter was armed, all_reduce called");
  if (finish_reduction(comm)) return;
  for (int64_t i = n_buckets() - 1; i >= 0; --i)
    allreduce(*comm, flat_.narrow(0, buckets_[i].offset, buckets_[i].numel), ReduceOp::Sum);
}

std::vector<GradBuffer::Range> GradBuffer::bucket_ranges() const {
  std::vector<Range> out;
  for (const auto& b : buckets_) out.push_back({b.offset, b.numel});
  return out;
}

double sum_of_squares_fp64(const at::Tensor& x) {
  // Pieces keep the fp64 copy and its squares at 16 MB, where a whole buffer's would be
  // 4x the buffer (2.4 GB at 298M elements: what ended a Qwen3-0.6B-shaped TP 2 run in
  // the OOM killer).
  constexpr int64_t kPiece = int64_t(1) << 20;
  const at::Tensor flat = x.reshape({-1});
  const int64_t n = flat.numel();
  at::Tensor sum = at::zeros({}, flat.options().dtype(at::kDouble));
  for (int64_t at = 0; at < n; at += kPiece) sum += flat.narrow(0, at, std::min(kPiece, n - at)).to(at::kDouble).square().sum();
  return sum.item<double>();
}

double GradBuffer::global_norm() const { return std::sqrt(sum_of_squares_fp64(flat_)); }

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
