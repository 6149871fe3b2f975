#include "model/head_top_k.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "model/transformer.h"
#include "parallel/comm_tensor.h"

namespace slimpi {

std::pair<at::Tensor, at::Tensor> head_top_k(const Transformer& model, const at::Tensor& hidden, const at::Tensor& rows,
                                             int64_t k, double temperature, int64_t vocab_limit) {
  at::NoGradGuard no_grad;
  const TensorShard& tp = model.tensor_shard();
  const int64_t N = rows.size(0), columns = model.lm_head().size(0);
  const int64_t chunk = std::max<int64_t>(1, (int64_t(1) << 22) / std::max<int64_t>(columns, 1));
  std::vector<at::Tensor> ids, probs;
  for (int64_t at = 0; at < N; at += chunk) {
    const int64_t n = std::min(chunk, N - at);
    at::Tensor z = model.head_logits(hidden.index_select(0, rows.narrow(0, at, n)));  // [n, Vl]
    // Padded vocabulary rows and ids from vocab_limit on never win.
    const int64_t open = std::min(model.n_real_vocab(), std::max<int64_t>(0, vocab_limit - model.vocab_begin()));
    if (open < columns) z.narrow(1, open, columns - open).fill_(-std::numeric_limits<float>::infinity());
    const int64_t kk = std::min(k, columns);
    auto [top_z, top_i] = z.topk(kk, 1);  // [n, kk]
    top_i = top_i + model.vocab_begin();
    if (tp.size > 1) {  // every shard's candidates, then the k largest of them
      const at::Tensor all_z = allgather(*tp.comm, top_z.contiguous()).permute({1, 0, 2}).reshape({n, -1});
      const at::Tensor all_i = allgather(*tp.comm, top_i.contiguous()).permute({1, 0, 2}).reshape({n, -1});
      auto [best_z, where] = all_z.topk(std::min(k, all_z.size(1)), 1);
      top_z = best_z;
      top_i = all_i.gather(1, where);
    }
    ids.push_back(top_i);
    probs.push_back(at::softmax(top_z / temperature, 1));
  }
  if (ids.empty()) {  // no row (a context-parallel rank holding none of them): [0, k'] each
    const int64_t kk = std::min(k, columns), width = tp.size > 1 ? std::min(k, kk * tp.size) : kk;
    const auto opts = hidden.options();
    return {at::empty({0, width}, opts.dtype(at::kLong)), at::empty({0, width}, opts.dtype(at::kFloat))};
  }
  return {at::cat(ids), at::cat(probs)};
}


}  // namespace slimpi
