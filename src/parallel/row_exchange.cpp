#include "parallel/row_exchange.h"

#include <torch/csrc/autograd/custom_function.h>

#include "parallel/comm.h"
#include "parallel/comm_tensor.h"

namespace slimpi {
namespace {

struct RowExchange : public torch::autograd::Function<RowExchange> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, Comm* comm,
                            const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows) {
    ctx->saved_data["send"] = send_rows;
    ctx->saved_data["recv"] = recv_rows;
    ctx->saved_data["comm"] = reinterpret_cast<int64_t>(comm);
    return alltoallv_rows(*comm, x.contiguous(), send_rows, recv_rows);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* comm = reinterpret_cast<Comm*>(ctx->saved_data["comm"].toInt());
    const std::vector<int64_t> send_rows = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv_rows = ctx->saved_data["recv"].toIntVector();
    // grads[0] is materialised (zeros) when the output was not used: the exchange still runs.
    at::Tensor back = alltoallv_rows(*comm, grads[0].contiguous(), recv_rows, send_rows);
    return {back, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor exchange_rows(Comm& comm, const at::Tensor& x, const std::vector<int64_t>& send_rows,
                         const std::vector<int64_t>& recv_rows) {
  return RowExchange::apply(x, &comm, send_rows, recv_rows);
}

}  // namespace slimpi
