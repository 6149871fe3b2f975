#include "rollout/engine_group.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>

#include <cstring>
#include <string>

#include "parallel/comm.h"
#include "parallel/comm_tensor.h"
#include "parallel/mpi_bytes.h"

namespace slimpi {
namespace {

// The announcement as one int64 vector:
//   release, n_copies, n_tokens, n_seqs, n_logit_rows (-1: every row), state_slots given (0/1),
//   n_state_copies, copies (src, dst)..., state copies (src, dst)..., tokens..., logit_rows...,
//   n_past..., n_new..., state_slots (n_seqs or none)..., slots...
constexpr size_t kHeader = 7;
std::vector<int64_t> encode(const EngineForward& f) {
  std::vector<int64_t> v{f.release ? 1 : 0, int64_t(f.block_copies.size()), int64_t(f.tokens.size()),
                         int64_t(f.n_past.size()), f.logit_rows ? int64_t(f.logit_rows->size()) : -1,
                         f.state_slots.empty() ? 0 : 1, int64_t(f.state_copies.size())};
  for (auto [src, dst] : f.block_copies) v.insert(v.end(), {src, dst});
  for (auto [src, dst] : f.state_copies) v.insert(v.end(), {src, dst});
  v.insert(v.end(), f.tokens.begin(), f.tokens.end());
  if (f.logit_rows) v.insert(v.end(), f.logit_rows->begin(), f.logit_rows->end());
  v.insert(v.end(), f.n_past.begin(), f.n_past.end());
  v.insert(v.end(), f.n_new.begin(), f.n_new.end());
  v.insert(v.end(), f.state_slots.begin(), f.state_slots.end());
  v.insert(v.end(), f.slots.begin(), f.slots.end());
  return v;
}

EngineForward decode(const std::vector<int64_t>& v) {
  SLIMPI_CHECK(v.size() >= kHeader, "engine group: an announcement of {} numbers", v.size());
  EngineForward f;
  f.release = v[0] != 0;
  const size_t n_copies = size_t(v[1]), n_tokens = size_t(v[2]), n_seqs = size_t(v[3]);
  size_t at = kHeader;
  for (size_t i = 0; i < n_copies; ++i, at += 2) f.block_copies.emplace_back(int32_t(v[at]), int32_t(v[at + 1]));
  for (size_t i = 0; i < size_t(v[6]); ++i, at += 2) f.state_copies.emplace_back(int32_t(v[at]), int32_t(v[at + 1]));
  auto take = [&](size_t n) {
    std::vector<int64_t> part(v.begin() + long(at), v.begin() + long(at + n));
    at += n;
    return part;
  };
  f.tokens = take(n_tokens);
  if (v[4] >= 0) f.logit_rows = take(size_t(v[4]));
  f.n_past = take(n_seqs);
  f.n_new = take(n_seqs);
  if (v[5] != 0) f.state_slots = take(n_seqs);
  f.slots = take(v.size() - at);
  return f;
}

}  // namespace

constexpr int kTagAnnounce = 111;  // leader -> follower: one EngineForward
const std::string kFollowerWait = "[rollout] an engine group's follower waiting for its leader's next forward";

void announce(MPI_Comm group, const EngineForward& f) {
  const std::vector<int64_t> v = encode(f);
  const std::string bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
  int size = 1;
  MPI_Comm_size(group, &size);
  for (int r = 1; r < size; ++r) send_message(group, bytes, r, kTagAnnounce);
}

EngineForward receive_announcement(MPI_Comm group) {
  const std::string bytes = recv_message(group, 0, kTagAnnounce, kFollowerWait);
  std::vector<int64_t> v(bytes.size() / sizeof(int64_t));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(int64_t));
  return decode(v);
}

void copy_kv_blocks(KvCache& cache, const std::vector<std::pair<int32_t, int32_t>>& copies, int64_t bs) {
  for (auto [src, dst] : copies) {
    for (size_t l = 0; l < cache.k.size(); ++l) {
      cache.k[l].narrow(0, int64_t(dst) * bs, bs).copy_(cache.k[l].narrow(0, int64_t(src) * bs, bs));
      if (!cache.values_are_keys)
        cache.v[l].narrow(0, int64_t(dst) * bs, bs).copy_(cache.v[l].narrow(0, int64_t(src) * bs, bs));
    }
    if (cache.routing.defined())
      cache.routing.narrow(0, int64_t(dst) * bs, bs).copy_(cache.routing.narrow(0, int64_t(src) * bs, bs));
  }
}

at::Tensor run_engine_forward(const Transformer& model, KvCache& cache, Precision precision, const EngineForward& f,
                              MoeTrace* moe, at::Tensor* hidden, bool to_logits) {
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  const at::Tensor host_slots = at::tensor(f.slots, long_opts);
  std::vector<CachedSequence> seqs;
  int64_t offset = 0;
  for (size_t i = 0; i < f.n_past.size(); ++i) {
    const int64_t n = f.n_past[i] + f.n_new[i];
    seqs.push_back({f.n_past[i], f.n_new[i], host_slots.narrow(0, offset, n),
                    f.state_slots.empty() ? int64_t(-1) : f.state_slots[i]});
    offset += n;
  }
  at::NoGradGuard no_grad;
  ForwardPrecision scope(precision, model.device());
  const at::Tensor logit_rows = f.logit_rows ? at::tensor(*f.logit_rows, long_opts) : at::Tensor();
  return model.forward_incremental(at::tensor(f.tokens, long_opts).to(model.device()), seqs, cache, moe, hidden,
                                   to_logits, logit_rows);
}

at::Tensor gather_vocab_shards(Comm& group, const at::Tensor& local, int64_t vocab_size) {
  const at::Tensor stacked = gather_to_first(group, local.contiguous());  // [e, T, Vp / e] on rank 0
  if (!stacked.defined()) return stacked;
  const int64_t T = local.size(0), width = stacked.size(0) * stacked.size(2);  // T = 0: a forward without logits
  return stacked.permute({1, 0, 2}).reshape({T, width}).narrow(1, 0, vocab_size).contiguous();  // [T, V]
}

EngineFollower::EngineFollower(const EngineConfig& cfg, const Transformer& model, MPI_Comm group)
    : cfg_(cfg),
      model_(model),
      group_(group),
      cache_(allocate_engine_cache(cfg, model)),
      precision_(engine_precision(model)) {
  SLIMPI_CHECK(model.tensor_shard().size > 1 && model.tensor_shard().rank > 0 && model.tensor_shard().comm &&
                   group != MPI_COMM_NULL,
               "engine follower: the model is not a follower's shard of a tensor-parallel engine");
}

void EngineFollower::follow() {
  Comm& group = *model_.tensor_shard().comm;
  for (;;) {
    const EngineForward f = receive_announcement(group_);
    if (f.release) return;
    copy_kv_blocks(cache_, f.block_copies, cfg_.block_size);
    for (auto [src, dst] : f.state_copies) cache_.copy_state(src, dst);
    const at::Tensor logits = run_engine_forward(model_, cache_, precision_, f, nullptr);  // [T, Vp / e]
    gather_vocab_shards(group, logits, model_.config().vocab_size);
  }
}

}  // namespace slimpi
