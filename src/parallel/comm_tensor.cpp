#include "parallel/comm_tensor.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

namespace slimpi {
namespace {

// The tensor the backend can touch: `t` itself, or a staged copy on the backend's side.
at::Tensor backend_view(const Comm& comm, const at::Tensor& t) {
  SLIMPI_CHECK(t.is_contiguous(), "comm '{}': tensor of shape {} is not contiguous", comm.name(),
               fmt::format("{}", fmt::join(t.sizes(), "x")));
  if (comm.device_memory() == t.is_cuda()) return t;
  return comm.device_memory() ? t.to(at::kCUDA) : t.cpu();
}

void copy_back(const at::Tensor& staged, const at::Tensor& t) {
  if (!staged.is_same(t)) t.copy_(staged);
}

}  // namespace

DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::F32;
    case at::kDouble: return DType::F64;
    case at::kBFloat16: return DType::BF16;
    case at::kHalf: return DType::F16;
    case at::kInt: return DType::I32;
    case at::kLong: return DType::I64;
    case at::kByte: case at::kBool: case at::kChar: return DType::U8;
    default: SLIMPI_FAIL("no collective dtype for torch dtype {}", std::string(c10::toString(t.scalar_type())));
  }
}

void allreduce(Comm& comm, const at::Tensor& t, ReduceOp op) {
  at::Tensor b = backend_view(comm, t);
  comm.allreduce(b.data_ptr(), b.numel(), dtype_of(b), op);
  copy_back(b, t);
}

void broadcast(Comm& comm, const at::Tensor& t, int root) {
  at::Tensor b = backend_view(comm, t);
  comm.broadcast(b.data_ptr(), b.numel(), dtype_of(b), root);
  copy_back(b, t);
}

at::Tensor allgather(Comm& comm, const at::Tensor& t) {
  at::Tensor b = backend_view(comm, t);
  std::vector<int64_t> shape{comm.size()};
  shape.insert(shape.end(), b.sizes().begin(), b.sizes().end());
  at::Tensor out = at::empty(shape, b.options());  // [size, *t.shape]
  comm.allgather(b.data_ptr(), out.data_ptr(), b.numel(), dtype_of(b));
  return out.to(t.device());
}

at::Tensor gather_to_first(Comm& comm, const at::Tensor& t) {
  if (comm.rank() != 0) {
    send(comm, t, 0);
    return at::Tensor();
  }
  std::vector<int64_t> shape{comm.size()};
  shape.insert(shape.end(), t.sizes().begin(), t.sizes().end());
  at::Tensor all = at::empty(shape, t.options());  // [size, *t.shape]
  all[0].copy_(t);
  for (int r = 1; r < comm.size(); ++r) {
    at::Tensor part = all[r];  // contiguous: a row of a contiguous tensor
    recv(comm, part, r);
  }
  return all;
}

at::Tensor reduce_scatter(Comm& comm, const at::Tensor& t) {
  SLIMPI_CHECK(t.dim() > 0 && t.size(0) % comm.size() == 0,
               "comm '{}': reduce-scatter of {} rows over {} ranks (the rows must split evenly)", comm.name(),
               t.dim() > 0 ? t.size(0) : 0, comm.size());
  at::Tensor b = backend_view(comm, t);
  std::vector<int64_t> shape = b.sizes().vec();
  shape[0] /= comm.size();
  at::Tensor out = at::empty(shape, b.options());
  comm.reduce_scatter(b.data_ptr(), out.data_ptr(), size_t(out.numel()), dtype_of(b));
  return out.to(t.device());
}

at::Tensor alltoallv_rows(Comm& comm, const at::Tensor& send, const std::vector<int64_t>& send_rows,
                          const std::vector<int64_t>& recv_rows) {
  const int n = comm.size();
  SLIMPI_CHECK(int(send_rows.size()) == n && int(recv_rows.size()) == n,
               "comm '{}': all-to-all row counts for {} and {} ranks, the comm has {}", comm.name(),
               send_rows.size(), recv_rows.size(), n);
  at::Tensor b = backend_view(comm, send);
  int64_t row = 1;  // elements per row
  for (int64_t i = 1; i < b.dim(); ++i) row *= b.size(i);
  std::vector<size_t> sc(n), rc(n);
  int64_t s_total = 0, r_total = 0;
  for (int p = 0; p < n; ++p) {
    sc[p] = size_t(send_rows[p] * row);
    rc[p] = size_t(recv_rows[p] * row);
    s_total += send_rows[p];
    r_total += recv_rows[p];
  }
  SLIMPI_CHECK(b.dim() > 0 && s_total == b.size(0), "comm '{}': all-to-all of {} rows, the tensor has {}",
               comm.name(), s_total, b.dim() > 0 ? b.size(0) : 0);
  std::vector<int64_t> shape = b.sizes().vec();
  shape[0] = r_total;
  at::Tensor out = at::empty(shape, b.options());
  comm.alltoallv(b.data_ptr(), sc.data(), out.data_ptr(), rc.data(), dtype_of(b));
  return out.to(send.device());
}

void send(Comm& comm, const at::Tensor& t, int peer) {
  at::Tensor b = backend_view(comm, t);
  comm.send(b.data_ptr(), b.numel(), dtype_of(b), peer);
}

void recv(Comm& comm, const at::Tensor& t, int peer) {
  at::Tensor b = backend_view(comm, t);
  comm.recv(b.data_ptr(), b.numel(), dtype_of(b), peer);
  copy_back(b, t);
}

void broadcast_bytes(Comm& comm, std::string& bytes, int root) {
  at::Tensor n = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);  // [1]
  broadcast(comm, n, root);
  bytes.resize(n.item<int64_t>());
  at::Tensor data = at::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, at::kByte);
  broadcast(comm, data, root);
}

void send_bytes(Comm& comm, const std::string& bytes, int peer) {
  at::Tensor n = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
  send(comm, n, peer);
  // send() only reads: the const_cast lets from_blob wrap the caller's bytes without a copy.
  send(comm, at::from_blob(const_cast<char*>(bytes.data()), {static_cast<int64_t>(bytes.size())}, at::kByte),
       peer);
}

std::string recv_bytes(Comm& comm, int peer) {
  at::Tensor n = at::empty({1}, at::kLong);
  recv(comm, n, peer);
  std::string bytes(n.item<int64_t>(), '\0');
  recv(comm, at::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, at::kByte), peer);
  return bytes;
}

}  // namespace slimpi
