#include "parallel/nccl_comm.h"

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <slimpi/error.h>

#include <algorithm>

#include "parallel/mpi_bytes.h"
#include "parallel/watchdog.h"

namespace slimpi {
namespace {

void check_cuda(cudaError_t code, const char* what) {
  if (code != cudaSuccess) SLIMPI_FAIL("{} failed: {}", what, cudaGetErrorString(code));
}
void check_nccl(ncclResult_t code, const char* what) {
  if (code != ncclSuccess) SLIMPI_FAIL("{} failed: {}", what, ncclGetErrorString(code));
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

}  // namespace

struct NcclComm::Handles {
  ncclComm_t comm = nullptr;
  int device = 0;
  float* barrier_word = nullptr;  // [1] on the device
  // Torch's current stream on the comm's device: where every operation is enqueued.
  cudaStream_t stream() const { return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream(); }
};

namespace {

// A collective enqueued on torch's stream; complete when that stream has passed it.
class NcclPending final : public PendingCollective {
 public:
  NcclPending(cudaStream_t stream, const std::string* context, const char* what, size_t count, DType dtype)
      : stream_(stream), context_(context), what_(what), count_(count), dtype_(dtype) {
    check_cuda(cudaEventCreateWithFlags(&done_event_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(done_event_, stream_), "cudaEventRecord");
  }
  ~NcclPending() override {
    if (!done_) cudaEventSynchronize(done_event_);
    cudaEventDestroy(done_event_);
  }
  bool test() override { return done_ = done_ || cudaEventQuery(done_event_) == cudaSuccess; }
  void wait() override {
    if (done_) return;
    WaitGuard guard({context_, what_, count_, dtype_name(dtype_)});
    check_cuda(cudaEventSynchronize(done_event_), "cudaEventSynchronize");
    done_ = true;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t done_event_ = nullptr;
  const std::string* context_;
  const char* what_;
  size_t count_;
  DType dtype_;
  bool done_ = false;
};

}  // namespace

NcclComm::NcclComm(MPI_Comm comm, std::string name, int device)
    : h_(std::make_unique<Handles>()), name_(std::move(name)) {
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
  context_ = fmt::format("[rank {} of comm '{}' ({} ranks, nccl)]", rank_, name_, size_);
  h_->device = device;
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId id;
  if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  check_mpi(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm), "MPI_Bcast(ncclUniqueId)");
  {
    WaitGuard guard({&context_, "ncclCommInitRank"});
    check_nccl(ncclCommInitRank(&h_->comm, size_, id, rank_), "ncclCommInitRank");
  }
  check_cuda(cudaMalloc(&h_->barrier_word, sizeof(float)), "cudaMalloc(barrier)");
}

NcclComm::~NcclComm() {
  if (h_->barrier_word) cudaFree(h_->barrier_word);
  if (h_->comm) ncclCommDestroy(h_->comm);
}

void NcclComm::finish(const char* what) { check_cuda(cudaStreamSynchronize(h_->stream()), what); }

std::unique_ptr<PendingCollective> NcclComm::iallreduce(void* data, size_t count, DType dtype, ReduceOp op) {
  const cudaStream_t stream = h_->stream();
  check_nccl(ncclAllReduce(data, data, count, nccl_type(dtype), nccl_op(op), h_->comm, stream), "ncclAllReduce");
  return std::make_unique<NcclPending>(stream, &context_, "iallreduce", count, dtype);
}

std::unique_ptr<PendingCollective> NcclComm::ireduce_scatter(const void* send, void* recv, size_t count,
                                                             DType dtype) {
  const cudaStream_t stream = h_->stream();
  check_nccl(ncclReduceScatter(send, recv, count, nccl_type(dtype), ncclSum, h_->comm, stream), "ncclReduceScatter");
  return std::make_unique<NcclPending>(stream, &context_, "ireduce_scatter", count, dtype);
}

void NcclComm::allreduce(void* data, size_t count, DType dtype, ReduceOp op) {
  WaitGuard guard({&context_, "allreduce", count, dtype_name(dtype)});
  check_nccl(ncclAllReduce(data, data, count, nccl_type(dtype), nccl_op(op), h_->comm, h_->stream()),
             "ncclAllReduce");
  finish("ncclAllReduce");
}

void NcclComm::broadcast(void* data, size_t count, DType dtype, int root) {
  WaitGuard guard({&context_, "broadcast", count, dtype_name(dtype)});
  check_nccl(ncclBroadcast(data, data, count, nccl_type(dtype), root, h_->comm, h_->stream()), "ncclBroadcast");
  finish("ncclBroadcast");
}

void NcclComm::allgather(const void* send, void* recv, size_t count, DType dtype) {
  WaitGuard guard({&context_, "allgather", count, dtype_name(dtype)});
  check_nccl(ncclAllGather(send, recv, count, nccl_type(dtype), h_->comm, h_->stream()), "ncclAllGather");
  finish("ncclAllGather");
}

void NcclComm::reduce_scatter(const void* send, void* recv, size_t count, DType dtype) {
  WaitGuard guard({&context_, "reduce_scatter", count, dtype_name(dtype)});
  check_nccl(ncclReduceScatter(send, recv, count, nccl_type(dtype), ncclSum, h_->comm, h_->stream()),
             "ncclReduceScatter");
  finish("ncclReduceScatter");
}

void NcclComm::alltoallv(const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                         DType dtype) {
  size_t s_total = 0, r_total = 0;
  for (int p = 0; p < size_; ++p) s_total += send_counts[p], r_total += recv_counts[p];
  WaitGuard guard({&context_, "alltoallv", std::max(s_total, r_total), dtype_name(dtype)});
  const size_t bytes = dtype_size(dtype);
  const auto* out = static_cast<const char*>(send);
  auto* in = static_cast<char*>(recv);
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  size_t s_off = 0, r_off = 0;
  for (int p = 0; p < size_; ++p) {  // one group: every pair's send and receive in flight together
    if (send_counts[p] > 0)
      check_nccl(ncclSend(out + s_off * bytes, send_counts[p], nccl_type(dtype), p, h_->comm, h_->stream()),
                 "ncclSend(alltoallv)");
    if (recv_counts[p] > 0)
      check_nccl(ncclRecv(in + r_off * bytes, recv_counts[p], nccl_type(dtype), p, h_->comm, h_->stream()),
                 "ncclRecv(alltoallv)");
    s_off += send_counts[p];
    r_off += recv_counts[p];
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  finish("alltoallv");
}

void NcclComm::send(const void* data, size_t count, DType dtype, int peer) {
  WaitGuard guard({&context_, "send", count, dtype_name(dtype), peer});
  check_nccl(ncclSend(data, count, nccl_type(dtype), peer, h_->comm, h_->stream()), "ncclSend");
  finish("ncclSend");
}

void NcclComm::recv(void* data, size_t count, DType dtype, int peer) {
  WaitGuard guard({&context_, "recv", count, dtype_name(dtype), peer});
  check_nccl(ncclRecv(data, count, nccl_type(dtype), peer, h_->comm, h_->stream()), "ncclRecv");
  finish("ncclRecv");
}

void NcclComm::barrier() {
  WaitGuard guard({&context_, "barrier"});
  check_nccl(ncclAllReduce(h_->barrier_word, h_->barrier_word, 1, ncclFloat32, ncclSum, h_->comm, h_->stream()),
             "ncclAllReduce(barrier)");
  finish("ncclAllReduce(barrier)");
}

}  // namespace slimpi
