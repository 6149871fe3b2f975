// Comm — the collective interface every slimpi component talks through.
//
// Implementations: MpiComm (host memory; always available) and NcclComm (CUDA device
// memory; compiled when the CUDA toolkit + NCCL are found, chosen at run time only when
// every rank has a GPU). Callers own their buffers; operations are blocking and
// in place where the name says so, except iallreduce and ireduce_scatter, which return
// at once with a PendingCollective (the overlap of gradient reduction with backward).
// Counts are in elements of `dtype`, any size (large MPI messages are chunked). Every
// call is watched by the Watchdog (parallel.timeout_s).
// Torch tensors go through the helpers of parallel/comm_tensor.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace slimpi {

enum class DType : uint8_t { F32, F64, BF16, F16, I32, I64, U8 };
enum class ReduceOp : uint8_t { Sum, Max, Min };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

// A collective in flight (Comm::iallreduce). Its buffer must not be read or written
// until wait() returns. wait() is idempotent; the destructor waits.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  // Lets the collective progress without blocking (MPI makes progress inside calls);
  // true once it is complete.
  virtual bool test() = 0;
  virtual void wait() = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;

  virtual const std::string& name() const = 0;  // "trainer", "sync", ...
  virtual const char* backend() const = 0;      // "mpi" | "nccl"
  virtual bool device_memory() const = 0;       // true: buffers must be CUDA memory
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[i] = op over ranks of data[i], on every rank.
  virtual void allreduce(void* data, size_t count, DType dtype, ReduceOp op) = 0;
  // allreduce, started now and finished by the returned handle's wait(). Every rank
  // must start its non-blocking collectives on a comm in the same order. For NCCL the
  // operation is ordered after the work already enqueued on torch's current stream.
  virtual std::unique_ptr<PendingCollective> iallreduce(void* data, size_t count, DType dtype, ReduceOp op) = 0;
  // data on every rank = data on `root`.
  virtual void broadcast(void* data, size_t count, DType dtype, int root) = 0;
  // recv[r * count + i] = send[i] of rank r; recv holds size() * count elements. In
  // place when send is recv + rank() * count.
  virtual void allgather(const void* send, void* recv, size_t count, DType dtype) = 0;
  // recv[i] = sum over ranks r of send[rank() * count + i] on rank r: send holds size()
  // blocks of count elements, block p summed into rank p's recv (Megatron's
  // reduce-scatter of sequence parallelism and of sharded gradients). In place when
  // recv is send + rank() * count (this rank's block of send gets the sums).
  virtual void reduce_scatter(const void* send, void* recv, size_t count, DType dtype) = 0;
  // reduce_scatter, started now and finished by the returned handle's wait() (neither
  // buffer may be touched before); ordered like iallreduce.
  virtual std::unique_ptr<PendingCollective> ireduce_scatter(const void* send, void* recv, size_t count,
                                                             DType dtype) = 0;
  // Personalised exchange: rank r's send holds, back to back in rank order, send_counts[p]
  // elements for each rank p; recv gets, back to back in rank order, recv_counts[p]
  // elements from each rank p (recv_counts[p] on this rank = send_counts[this rank] on p).
  virtual void alltoallv(const void* send, const size_t* send_counts, void* recv, const size_t* recv_counts,
                         DType dtype) = 0;
  virtual void send(const void* data, size_t count, DType dtype, int peer) = 0;
  virtual void recv(void* data, size_t count, DType dtype, int peer) = 0;
  virtual void barrier() = 0;
};

}  // namespace slimpi
