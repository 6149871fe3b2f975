#include "train/pipeline_links.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <slimpi/error.h>

#include <cstring>
#include <limits>

#include "core/timer.h"
#include "parallel/mpi_bytes.h"
#include "parallel/mpi_comm.h"
#include "parallel/watchdog.h"

namespace slimpi {
namespace {

constexpr int kForwardTag = 711, kBackwardTag = 712, kForwardCountsTag = 713, kBackwardCountsTag = 714;

const char* what_travels(int tag) {
  switch (tag) {
    case kForwardTag: return "activations";
    case kBackwardTag: return "gradients";
    default: return "router choice counts";
  }
}

// [k, E] f64 counts as the fp32 words of their bits (links carry fp32), and back.
at::Tensor counts_as_words(const at::Tensor& counts) {
  return counts.to(at::kCPU, at::kDouble).contiguous().view(at::kFloat);  // [k, 2E]
}

}  // namespace

namespace {

MPI_Comm raw_comm(const PipelineShard& stage) {
  const auto* mpi = dynamic_cast<const MpiComm*>(stage.comm);
  SLIMPI_CHECK(mpi && mpi->size() == stage.size, "pipeline stage {} of {}: its group must be an MPI communicator of "
               "the stages", stage.stage, stage.size);
  return mpi->mpi_comm();
}

}  // namespace

PipelineLinks::PipelineLinks(const PipelineShard& stage)
    : stage_(stage), comm_(raw_comm(stage)), sends_(comm_, fmt::format("[pipeline] stage {}'s sends", stage.stage)) {}

PipelineLinks::~PipelineLinks() = default;

void PipelineLinks::send(const at::Tensor& t, int peer, int tag) {
  const at::Tensor host = t.detach().to(at::kCPU, at::kFloat).contiguous();
  SLIMPI_CHECK(host.numel() <= std::numeric_limits<int>::max() / int64_t(sizeof(float)),
               "pipeline stage {}: an activation of [{}] is 2 GiB or more, past one MPI message (split the batch "
               "into more micro-batches)", stage_.stage, fmt::join(host.sizes(), ", "));
  std::string bytes(size_t(host.numel()) * sizeof(float), '\0');
  if (!bytes.empty()) std::memcpy(bytes.data(), host.data_ptr<float>(), bytes.size());
  sends_.post(std::move(bytes), peer, tag);
}

at::Tensor PipelineLinks::recv(int64_t rows, int64_t d, const at::TensorOptions& options, int peer, int tag) {
  const std::string context =
      fmt::format("[pipeline] stage {} receiving {} from stage {}", stage_.stage, what_travels(tag), peer);
  sends_.reap();
  const Stopwatch clock;
  await_message(comm_, peer, tag, context);
  waited_s_ += clock.seconds();
  at::Tensor host = at::empty({rows, d}, at::kFloat);
  MPI_Status status;
  const int64_t n_bytes = host.numel() * int64_t(sizeof(float));  // (sent as bytes: PostedSends)
  WaitGuard guard({&context, "MPI_Recv", size_t(n_bytes), "u8", peer});
  check_mpi(MPI_Recv(host.data_ptr(), int(n_bytes), MPI_BYTE, peer, tag, comm_, &status), "MPI_Recv");
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  SLIMPI_CHECK(count == n_bytes, "{}: {} bytes arrived for [{}, {}] fp32", context, count, rows, d);
  return host.to(options.device());
}

void PipelineLinks::send_forward(const at::Tensor& y) { send(y, stage_.stage + 1, kForwardTag); }
void PipelineLinks::send_backward(const at::Tensor& dx) { send(dx, stage_.stage - 1, kBackwardTag); }
at::Tensor PipelineLinks::recv_forward(int64_t rows, int64_t d, const at::TensorOptions& options) {
  return recv(rows, d, options, stage_.stage - 1, kForwardTag);
}
at::Tensor PipelineLinks::recv_backward(int64_t rows, int64_t d, const at::TensorOptions& options) {
  return recv(rows, d, options, stage_.stage + 1, kBackwardTag);
}
void PipelineLinks::send_forward_counts(const at::Tensor& counts) {
  send(counts_as_words(counts), stage_.stage + 1, kForwardCountsTag);
}
void PipelineLinks::send_backward_counts(const at::Tensor& counts) {
  send(counts_as_words(counts), stage_.stage - 1, kBackwardCountsTag);
}
at::Tensor PipelineLinks::recv_forward_counts(int64_t k, int64_t n_experts) {
  return recv(k, 2 * n_experts, at::kFloat, stage_.stage - 1, kForwardCountsTag).view(at::kDouble);
}
at::Tensor PipelineLinks::recv_backward_counts(int64_t k, int64_t n_experts) {
  return recv(k, 2 * n_experts, at::kFloat, stage_.stage + 1, kBackwardCountsTag).view(at::kDouble);
}
void PipelineLinks::finish() {
  const Stopwatch clock;
  sends_.flush();
  waited_s_ += clock.seconds();
}

}  // namespace slimpi
