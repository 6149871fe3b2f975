#include "parallel/mpi_comm.h"

#include <slimpi/error.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "parallel/mpi_bytes.h"
#include "parallel/watchdog.h"

namespace slimpi {
namespace {

constexpr size_t kMaxChunk = size_t(1) << 30;  // elements per MPI call

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
    case DType::BF16:
    case DType::F16: return MPI_UINT16_T;  // moved as bits; reductions need bf16_sum_op
  }
  return MPI_BYTE;
}

// bf16 = the top 16 bits of an IEEE float; sum in fp32, round to nearest even.
float bf16_to_float(uint16_t v) {
  uint32_t bits = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);  // NaN stays NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

MPI_Op bf16_sum_op() {
  static MPI_Op op = [] {
    MPI_Op o;
    MPI_Op_create(&bf16_sum, /*commute=*/1, &o);
    return o;
  }();
  return op;
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  if (dtype == DType::BF16) {
    SLIMPI_CHECK(op == ReduceOp::Sum, "MPI backend: bf16 allreduce supports only sum");
    return bf16_sum_op();
  }
  SLIMPI_CHECK(dtype != DType::F16, "MPI backend: fp16 allreduce is not supported; use fp32 or bf16");
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

// Calls fn(offset, n) over [0, count) in chunks of at most kMaxChunk.
template <class Fn>
void chunked(size_t count, Fn fn) {
  for (size_t off = 0; off < count; off += kMaxChunk) fn(off, static_cast<int>(std::min(kMaxChunk, count - off)));
}

}  // namespace

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32: case DType::I32: return 4;
    case DType::F64: case DType::I64: return 8;
    case DType::BF16: case DType::F16: return 2;
    case DType::U8: return 1;
  }
  return 1;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
  }
  return "?";
}

MpiComm::MpiComm(MPI_Comm comm, std::string name) : name_(std::move(name)) {
  SLIMPI_CHECK(comm != MPI_COMM_NULL, "MpiComm '{}' made from MPI_COMM_NULL", name_);
  check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  context_ = fmt::format("[rank {} of comm '{}' ({} ranks, mpi)]", rank_, name_, size_);
}

MpiComm::~MpiComm() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiComm::allreduce(void* data, size_t count, DType dtype, ReduceOp op) {
  WaitGuard guard({&context_, "allreduce", count, dtype_name(dtype)});
  MPI_Op mop = mpi_op(op, dtype);
  auto* bytes = static_cast<char*>(data);
  chunked(count, [&](size_t off, int n) {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, bytes + off * dtype_size(dtype), n, mpi_type(dtype), mop, comm_),
              "MPI_Allreduce");
  });
}

namespace {

// Non-blocking MPI collectives over chunks (`what`: their name); wait() under the watchdog.
class MpiPending final : public PendingCollective {
 public:
  MpiPending(const std::string* context, const char* what, size_t count, DType dtype)
      : context_(context), what_(what), count_(count), dtype_(dtype) {}
  ~MpiPending() override {  // never leave MPI writing into a freed buffer; errors abort in MPI
    if (!done_) MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  }
  std::vector<MPI_Request> requests;
  std::vector<std::vector<char>> staging;  // packed send chunks, alive until the requests complete
  std::function<void()> on_complete;       // run once, when the requests have completed

  bool test() override {
    if (done_) return true;
    int flag = 0;
    check_mpi(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE),
              "MPI_Testall");
    if (flag) complete();
    return done_;
  }
  void wait() override {
    if (done_) return;
    WaitGuard guard({context_, what_, count_, dtype_name(dtype_)});
    check_mpi(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    complete();
  }

 private:
  void complete() {
    done_ = true;
    if (on_complete) on_complete();
    on_complete = nullptr;
  }
  const std::string* context_;
  const char* what_;
  size_t count_;
  DType dtype_;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<PendingCollective> MpiComm::iallreduce(void* data, size_t count, DType dtype, ReduceOp op) {
  auto pending = std::make_unique<MpiPending>(&context_, "iallreduce", count, dtype);
  MPI_Op mop = mpi_op(op, dtype);
  auto* bytes = static_cast<char*>(data);
  chunked(count, [&](size_t off, int n) {
    pending->requests.emplace_back();
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, bytes + off * dtype_size(dtype), n, mpi_type(dtype), mop, comm_,
                             &pending->requests.back()),
              "MPI_Iallreduce");
  });
  return pending;
}

void MpiComm::broadcast(void* data, size_t count, DType dtype, int root) {
  WaitGuard guard({&context_, "broadcast", count, dtype_name(dtype)});
  auto* bytes = static_cast<char*>(data);
  chunked(count, [&](size_t off, int n) {
    check_mpi(MPI_Bcast(bytes + off * dtype_size(dtype), n, mpi_type(dtype), root, comm_), "MPI_Bcast");
  });
}

void MpiComm::reduce_scatter(const void* send, void* recv, size_t count, DType dtype) {
  WaitGuard guard({&context_, "reduce_scatter", count, dtype_name(dtype)});
  MPI_Op mop = mpi_op(ReduceOp::Sum, dtype);
  const size_t bytes = dtype_size(dtype);
  if (count * size_t(size_) <= kMaxChunk) {
    if (in_place_block(send, recv, count, dtype)) {  // MPI puts in-place sums in block 0: moved to this rank's
      check_mpi(MPI_Reduce_scatter_block(MPI_IN_PLACE, const_cast<void*>(send), static_cast<int>(count),
                                         mpi_type(dtype), mop, comm_),
                "MPI_Reduce_scatter_block");
      if (rank_ != 0) std::memcpy(recv, send, count * bytes);
      return;
    }
    check_mpi(MPI_Reduce_scatter_block(send, recv, static_cast<int>(count), mpi_type(dtype), mop, comm_),
              "MPI_Reduce_scatter_block");
    return;
  }
  // Beyond int counts: the same blocks a chunk at a time, each chunk's pieces packed
  // (in place too: a chunk's sums land where that chunk has already been read).
  const size_t chunk = std::max<size_t>(1, kMaxChunk / size_t(size_));
  std::vector<char> packed(std::min(chunk, count) * size_t(size_) * bytes);
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  for (size_t off = 0; off < count; off += chunk) {
    const size_t n = std::min(chunk, count - off);
    for (int r = 0; r < size_; ++r) std::memcpy(packed.data() + r * n * bytes, in + (r * count + off) * bytes, n * bytes);
    check_mpi(MPI_Reduce_scatter_block(packed.data(), out + off * bytes, static_cast<int>(n), mpi_type(dtype), mop,
                                       comm_),
              "MPI_Reduce_scatter_block");
  }
}

std::unique_ptr<PendingCollective> MpiComm::ireduce_scatter(const void* send, void* recv, size_t count, DType dtype) {
  auto pending = std::make_unique<MpiPending>(&context_, "ireduce_scatter", count, dtype);
  MPI_Op mop = mpi_op(ReduceOp::Sum, dtype);
  if (count * size_t(size_) <= kMaxChunk && in_place_block(send, recv, count, dtype)) {
    pending->requests.emplace_back();
    check_mpi(MPI_Ireduce_scatter_block(MPI_IN_PLACE, const_cast<void*>(send), static_cast<int>(count),
                                        mpi_type(dtype), mop, comm_, &pending->requests.back()),
              "MPI_Ireduce_scatter_block");
    if (rank_ != 0)  // the sums arrive in block 0: moved to this rank's block once complete
      pending->on_complete = [recv, send, n = count * dtype_size(dtype)] { std::memcpy(recv, send, n); };
    return pending;
  }
  if (count * size_t(size_) <= kMaxChunk) {
    pending->requests.emplace_back();
    check_mpi(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count), mpi_type(dtype), mop, comm_,
                                        &pending->requests.back()),
              "MPI_Ireduce_scatter_block");
    return pending;
  }
  // Beyond int counts: as reduce_scatter, each chunk's pieces packed (kept by the pending).
  const size_t bytes = dtype_size(dtype), chunk = std::max<size_t>(1, kMaxChunk / size_t(size_));
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  for (size_t off = 0; off < count; off += chunk) {
    const size_t n = std::min(chunk, count - off);
    std::vector<char>& packed = pending->staging.emplace_back(n * size_t(size_) * bytes);
    for (int r = 0; r < size_; ++r) std::memcpy(packed.data() + r * n * bytes, in + (r * count + off) * bytes, n * bytes);
    pending->requests.emplace_back();
    check_mpi(MPI_Ireduce_scatter_block(packed.data(), out + off * bytes, static_cast<int>(n), mpi_type(dtype), mop,
                                        comm_, &pending->requests.back()),
              "MPI_Ireduce_scatter_block");
  }
  return pending;
}

void MpiComm::allgather(const void* send, void* recv, size_t count, DType dtype) {
  WaitGuard guard({&context_, "allgather", count, dtype_name(dtype)});
  const bool in_place = in_place_block(recv, send, count, dtype);
  if (count <= kMaxChunk) {
    check_mpi(MPI_Allgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(count), mpi_type(dtype), recv,
                            static_cast<int>(count), mpi_type(dtype), comm_),
              "MPI_Allgather");
    return;
  }
  // Beyond int counts: each rank broadcasts its part in turn.
  const size_t bytes = count * dtype_size(dtype);
  auto* out = static_cast<char*>(recv);
  if (!in_place) std::memcpy(out + rank_ * bytes, send, bytes);
  for (int r = 0; r < size_; ++r)
    chunked(count, [&](size_t off, int n) {
      check_mpi(MPI_Bcast(out + r * bytes + off * dtype_size(dtype), n, mpi_type(dtype), r, comm_),
                "MPI_Bcast(allgather)");
    });
}

void MpiComm::alltoallv(const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                        DType dtype) {
  // MPI_Alltoallv takes int counts and displacements: each side's total must fit.
  std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
  size_t s_total = 0, r_total = 0;
  for (int p = 0; p < size_; ++p) {
    sd[p] = static_cast<int>(s_total);
    rd[p] = static_cast<int>(r_total);
    sc[p] = static_cast<int>(send_counts[p]);
    rc[p] = static_cast<int>(recv_counts[p]);
    s_total += send_counts[p];
    r_total += recv_counts[p];
    SLIMPI_CHECK(s_total <= kMaxChunk && r_total <= kMaxChunk,
                 "comm '{}': an all-to-all of more than 2^30 {} elements per rank (use smaller micro-batches)",
                 name_, dtype_name(dtype));
  }
  WaitGuard guard({&context_, "alltoallv", std::max(s_total, r_total), dtype_name(dtype)});
  check_mpi(MPI_Alltoallv(send, sc.data(), sd.data(), mpi_type(dtype), recv, rc.data(), rd.data(), mpi_type(dtype),
                          comm_),
            "MPI_Alltoallv");
}

void MpiComm::send(const void* data, size_t count, DType dtype, int peer) {
  WaitGuard guard({&context_, "send", count, dtype_name(dtype), peer});
  auto* bytes = static_cast<const char*>(data);
  chunked(count, [&](size_t off, int n) {
    check_mpi(MPI_Send(bytes + off * dtype_size(dtype), n, mpi_type(dtype), peer, 0, comm_), "MPI_Send");
  });
}

void MpiComm::recv(void* data, size_t count, DType dtype, int peer) {
  WaitGuard guard({&context_, "recv", count, dtype_name(dtype), peer});
  auto* bytes = static_cast<char*>(data);
  chunked(count, [&](size_t off, int n) {
    check_mpi(MPI_Recv(bytes + off * dtype_size(dtype), n, mpi_type(dtype), peer, 0, comm_, MPI_STATUS_IGNORE),
              "MPI_Recv");
  });
}

void MpiComm::barrier() {
  WaitGuard guard({&context_, "barrier"});
  check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
}

}  // namespace slimpi
