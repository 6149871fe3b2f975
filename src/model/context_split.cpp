#include "model/context_split.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include "parallel/comm.h"
#include "parallel/tp_mappings.h"

namespace slimpi {

ContextSplit::ContextSplit(const ContextShard& shard, const std::vector<int64_t>& seq_lens, const at::Device& device)
    : shard_(shard), device_(device), seq_lens_(seq_lens) {
  const int c = shard.size, me = shard.rank;
  SLIMPI_CHECK(c >= 1 && me >= 0 && me < c && (c == 1 || (shard.comm && shard.comm->size() == c)),
               "context shard {} of {} without its group", me, c);
  for (int64_t L : seq_lens) n_tokens_ += L;
  owner_.assign(size_t(n_tokens_), 0);
  local_index_.assign(size_t(n_tokens_), 0);
  std::vector<int64_t> n_held(size_t(c), 0);
  int64_t seq_start = 0;
  for (size_t b = 0; b < seq_lens.size(); ++b) {
    const int64_t L = seq_lens[b];
    auto bound = [&](int64_t j) { return j * L / (2 * c); };  // chunk j = [bound(j), bound(j + 1))
    for (int r = 0; r < c; ++r)
      for (const int64_t j : {int64_t(r), int64_t(2 * c - 1 - r)})
        for (int64_t pos = bound(j); pos < bound(j + 1); ++pos) {
          owner_[size_t(seq_start + pos)] = r;
          if (r == me && pos == bound(j)) chunks_.push_back({int64_t(b), seq_start, bound(j), bound(j + 1), 0});
        }
    seq_start += L;
  }
  // Local indices in packed order: a rank's rows, increasing (chunk i before chunk 2c−1−i).
  for (int64_t row = 0; row < n_tokens_; ++row) {
    const int r = owner_[size_t(row)];
    local_index_[size_t(row)] = n_held[size_t(r)]++;
    if (r == me) local_rows_host_.push_back(row);
  }
  for (Chunk& ch : chunks_) ch.local_start = local_index_[size_t(ch.seq_start + ch.begin)];
  local_rows_ = at::tensor(local_rows_host_, at::kLong).to(device);
  std::vector<int64_t> every(static_cast<size_t>(n_tokens_), 0);
  for (int64_t row = 0; row < n_tokens_; ++row) every[size_t(row)] = row;
  all_rows_ = items_of(every);
}

ContextSplit::Items ContextSplit::items_of(const std::vector<int64_t>& rows) const {
  const int c = shard_.size;
  std::vector<int64_t> count(size_t(c), 0), local_items, local_rows, slot(rows.size());
  for (size_t j = 0; j < rows.size(); ++j) {
    const int64_t row = rows[j];
    SLIMPI_CHECK(row >= 0 && row < n_tokens_, "context split: item row {} of a batch of {} tokens", row, n_tokens_);
    const int r = owner_[size_t(row)];
    slot[j] = count[size_t(r)]++;
    if (r == shard_.rank) {
      local_items.push_back(int64_t(j));
      local_rows.push_back(local_index_[size_t(row)]);
    }
  }
  Items it;
  for (int64_t n : count) it.max_count = std::max(it.max_count, n);
  std::vector<int64_t> at(rows.size());
  for (size_t j = 0; j < rows.size(); ++j) at[j] = owner_[size_t(rows[j])] * it.max_count + slot[j];
  it.local_items = at::tensor(local_items, at::kLong).to(device_);
  it.local_rows = at::tensor(local_rows, at::kLong).to(device_);
  it.gathered_at = at::tensor(at, at::kLong).to(device_);
  return it;
}

ContextSplit::Items ContextSplit::items(const at::Tensor& rows) const {
  const at::Tensor host = rows.to(at::kCPU, at::kLong).contiguous();
  return items_of(std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel()));
}

namespace {

// local [n_i, ...] -> [max_count, ...] (zero rows after this rank's).
at::Tensor padded_to(const at::Tensor& local, int64_t max_count) {
  if (local.size(0) == max_count) return local;
  std::vector<int64_t> shape = local.sizes().vec();
  shape[0] = max_count - local.size(0);
  return at::cat({local, at::zeros(shape, local.options())});
}

}  // namespace

at::Tensor ContextSplit::gather_items(const Items& it, const at::Tensor& local) const {
  SLIMPI_CHECK(local.size(0) == it.local_items.size(0), "context split: {} local values for {} local items",
               local.size(0), it.local_items.size(0));
  if (shard_.size == 1) return local;
  const at::Tensor all = gather_from_sequence_for_replicated(shard_.comm, padded_to(local, it.max_count));
  return all.index_select(0, it.gathered_at);  // [n, ...]
}

at::Tensor ContextSplit::gather_rows(const at::Tensor& local) const {
  SLIMPI_CHECK(local.size(0) == n_local(), "context split: {} rows for this rank's {}", local.size(0), n_local());
  if (shard_.size == 1) return local;
  const at::Tensor all = gather_from_sequence(shard_.comm, padded_to(local, all_rows_.max_count));
  return all.index_select(0, all_rows_.gathered_at);  // [T, ...]
}

}  // namespace slimpi
