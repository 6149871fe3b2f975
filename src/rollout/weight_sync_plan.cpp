#include "rollout/weight_sync_plan.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "core/timer.h"
#include "model/tensor_shard.h"
#include "model/transformer.h"
#include "parallel/comm.h"
#include "parallel/comm_tensor.h"

namespace slimpi {
namespace {

// The rows [begin, end) along the split dimension that shard `rank` of `size` holds of a
// tensor whose whole extent there is `whole` (padded to `padded` when split); everything
// when the tensor is not split at this size.
struct Held {
  int64_t begin = 0, end = 0, origin = 0;  // origin: the whole index of the shard's local row 0
};
Held held(const ParameterSplit& split, int64_t whole, int rank, int size) {
  if (!split.split()) return {0, whole, 0};
  const int64_t n = split.padded / size, origin = n * rank;
  return {std::min(origin, split.whole), std::min(origin + n, split.whole), origin};
}

// Expert x of a ".mlp.experts.<x>." tensor (-1: not an expert's).
int64_t expert_index(const std::string& name) {
  static const std::string marker = ".mlp.experts.";
  const size_t at = name.find(marker);
  return at == std::string::npos ? -1 : std::stoll(name.substr(at + marker.size()));
}

std::string describe_tensors(const std::vector<WholeTensor>& tensors) {
  std::string s;
  for (const auto& t : tensors) s += fmt::format("{} {}\n", t.name, fmt::join(t.shape, "x"));
  return s;
}

std::vector<WholeTensor> parse_tensors(const std::string& text) {
  std::vector<WholeTensor> out;
  std::istringstream in(text);
  std::string name, shape;
  while (in >> name >> shape) {
    WholeTensor t{name, {}};
    std::istringstream dims(shape);
    for (std::string d; std::getline(dims, d, 'x');) t.shape.push_back(std::stoll(d));
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

WeightSyncPlan::WeightSyncPlan(const ModelConfig& cfg, const SyncLayout& layout, std::vector<WholeTensor> tensors)
    : layout_(layout), tensors_(std::move(tensors)) {
  const int t = layout.trainer_tensor, e = layout.engine_tensor;
  const int64_t experts_per_index = cfg.n_experts > 0 ? cfg.n_experts / layout.trainer_expert : 0;
  for (int i = 0; i < int(tensors_.size()); ++i) {
    const WholeTensor& w = tensors_[size_t(i)];
    const ParameterSplit ts = parameter_split(w.name, cfg, t), es = parameter_split(w.name, cfg, e);
    const int dim = ts.split() ? ts.dim : es.split() ? es.dim : 0;
    const int64_t whole = w.shape.empty() ? 1 : w.shape[size_t(dim)];
    const int64_t x = expert_index(w.name);
    const int data_index = x >= 0 ? int(x / experts_per_index) : 0;  // the trainer's holder of expert x
    for (int engine = 0; engine < layout.n_engines; ++engine)
      for (int j = 0; j < e; ++j) {
        const Held want = held(es, whole, j, e);
        const int member = layout.engine_member(engine, j);
        if (ts.split()) {
          for (int k = 0; k < t; ++k) {
            const Held have = held(ts, whole, k, t);
            const int64_t begin = std::max(want.begin, have.begin), end = std::min(want.end, have.end);
            if (begin < end)
              pieces_.push_back({i, data_index * t + k, member, dim, begin, end, have.origin, want.origin, 0});
          }
        } else {
          const int k = (i + engine * e + j) % t;  // replicated over the trainer's group: spread the senders
          if (want.begin < want.end)
            pieces_.push_back({i, data_index * t + k, member, dim, want.begin, want.end, 0, want.origin, 0});
        }
      }
  }
  for (WeightPiece& p : pieces_) {
    const std::vector<int64_t>& shape = tensors_[size_t(p.tensor)].shape;
    p.numel = p.end - p.begin;
    for (size_t d = 0; d < shape.size(); ++d)
      if (int(d) != p.dim) p.numel *= shape[d];
  }
  std::stable_sort(pieces_.begin(), pieces_.end(), [](const WeightPiece& a, const WeightPiece& b) {
    return std::tie(a.dst, a.src, a.tensor) < std::tie(b.dst, b.src, b.tensor);
  });
}

int64_t WeightSyncPlan::total_elements() const {
  int64_t n = 0;
  for (const auto& p : pieces_) n += p.numel;
  return n;
}

SlicedWeightSync::SlicedWeightSync(Comm& sync, const ModelConfig& cfg, const SyncLayout& layout, int64_t bucket_bytes)
    : comm_(sync), cfg_(cfg), layout_(layout), bucket_bytes_(bucket_bytes) {
  SLIMPI_CHECK(bucket_bytes > 0, "weight sync bucket of {} bytes", bucket_bytes);
  SLIMPI_CHECK(sync.size() == layout.n_members(),
               "sliced weight sync: {} members for {} trainer ranks + {} engines of {} ranks", sync.size(),
               layout.n_trainer_members(), layout.n_engines, layout.engine_tensor);
  bucket_ = at::empty({bucket_bytes}, at::TensorOptions().dtype(at::kByte).device(
                                          sync.device_memory() ? at::Device(at::kCUDA) : at::Device(at::kCPU)));
}

std::vector<WholeTensor> SlicedWeightSync::agree_on_tensors(const std::vector<NamedTensor>& local) {
  const int root = layout_.n_trainer_members();  // the first engine rank: its model has every tensor
  std::string text;
  if (comm_.rank() == root) {
    std::vector<WholeTensor> mine;
    const StoredWhole stored{&cfg_, {0, layout_.engine_tensor, nullptr}};  // shapes only: no group needed
    for (const auto& p : local) mine.push_back({p.name, stored.whole_shape(p.name, p.tensor.sizes().vec())});
    text = describe_tensors(mine);
  }
  broadcast_bytes(comm_, text, root);
  return parse_tensors(text);
}

WeightSyncStats SlicedWeightSync::sync(const std::vector<NamedTensor>& local, at::ScalarType wire, int64_t* version,
                                       bool checksum) {
  Stopwatch clock;
  at::NoGradGuard no_grad;
  at::Tensor v = at::full({1}, *version, at::kLong);
  broadcast(comm_, v, 0);
  *version = v.item<int64_t>();
  if (!planned_) {
    plan_ = WeightSyncPlan(cfg_, layout_, agree_on_tensors(local));
    planned_ = true;
  }
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& p : local) by_name[p.name] = &p.tensor;
  const int me = comm_.rank();
  const int64_t elem = int64_t(c10::elementSize(wire));
  auto local_part = [&](const WeightPiece& p, int64_t origin) {  // this rank's view of the piece
    const WholeTensor& w = plan_.tensors()[size_t(p.tensor)];
    auto it = by_name.find(w.name);
    SLIMPI_CHECK(it != by_name.end(), "weight sync: sync rank {} lacks {} (the plan sends it rows {}..{})", me,
                 w.name, p.begin, p.end - 1);
    const at::Tensor& t = *it->second;
    const int64_t first = p.begin - origin;
    SLIMPI_CHECK(t.dim() == int64_t(w.shape.size()) && t.dim() > p.dim && first >= 0 && p.end - origin <= t.size(p.dim),
                 "weight sync: {} on sync rank {} has shape {}, which does not hold rows {}..{} of the whole {}",
                 w.name, me, fmt::format("{}", fmt::join(t.sizes(), "x")), p.begin, p.end - 1,
                 fmt::format("{}", fmt::join(w.shape, "x")));
    return t.detach().narrow(p.dim, first, p.end - p.begin);
  };
  const std::vector<WeightPiece>& pieces = plan_.pieces();
  std::map<size_t, std::vector<uint8_t>> arriving;  // receiver: bytes so far of pieces that span buckets
  size_t converted_piece = pieces.size();           // sender: the piece whose wire bytes are at hand
  at::Tensor converted;
  WeightSyncStats stats;
  stats.bytes = plan_.total_elements() * elem;
  // Pairs in the plan's (receiver, sender) order; each pair's pieces back to back in buckets.
  for (size_t a = 0; a < pieces.size();) {
    size_t b = a;
    while (b < pieces.size() && pieces[b].dst == pieces[a].dst && pieces[b].src == pieces[a].src) ++b;
    const int src = pieces[a].src, dst = pieces[a].dst;
    if (src == me || dst == me) {
      const bool sending = src == me;
      uint64_t hash = kFnvOffset;
      // Fill / drain buckets: piece p's bytes [from, from + n) at bucket offset `at`.
      struct Span { size_t piece; int64_t from, n, at; };
      std::vector<Span> spans;
      int64_t used = 0;
      auto flush = [&] {
        if (used == 0) return;
        at::Tensor bucket = bucket_.narrow(0, 0, used);
        if (sending) {
          for (const Span& s : spans) {
            const WeightPiece& p = pieces[s.piece];
            if (converted_piece != s.piece) {
              converted = local_part(p, p.src_origin).to(wire).contiguous().view({-1}).view(at::kByte);
              converted_piece = s.piece;
            }
            bucket.narrow(0, s.at, s.n).copy_(converted.narrow(0, s.from, s.n));
          }
          send(comm_, bucket, dst);
        } else {
          recv(comm_, bucket, src);
          for (const Span& s : spans) {  // whole pieces in this bucket are copied at once, split ones in parts
            const WeightPiece& p = pieces[s.piece];
            at::Tensor target = local_part(p, p.dst_origin);
            at::Tensor staged = at::empty(target.sizes(), target.options().dtype(wire)).contiguous();
            if (s.n == p.numel * elem) {
              staged.view({-1}).view(at::kByte).copy_(bucket.narrow(0, s.at, s.n));
              target.copy_(staged);
            } else {
              std::vector<uint8_t>& acc = arriving[s.piece];
              acc.resize(size_t(p.numel * elem));
              at::Tensor host = bucket.narrow(0, s.at, s.n).cpu();
              std::copy(host.data_ptr<uint8_t>(), host.data_ptr<uint8_t>() + s.n, acc.begin() + s.from);
              if (s.from + s.n == p.numel * elem) {
                staged.view({-1}).view(at::kByte).copy_(at::from_blob(acc.data(), {int64_t(acc.size())}, at::kByte));
                target.copy_(staged);
                arriving.erase(s.piece);
              }
            }
          }
        }
        if (checksum) {
          at::Tensor host = bucket.cpu();
          hash = fnv1a(hash, host.data_ptr<uint8_t>(), host.numel());
        }
        ++stats.n_buckets;
        spans.clear();
        used = 0;
      };
      for (size_t i = a; i < b; ++i) {
        const int64_t total = pieces[i].numel * elem;
        for (int64_t from = 0; from < total;) {
          const int64_t n = std::min(total - from, bucket_bytes_ - used);
          spans.push_back({i, from, n, used});
          used += n;
          from += n;
          if (used == bucket_bytes_) flush();
        }
      }
      flush();
      if (checksum) {
        at::Tensor h = at::full({1}, int64_t(hash), at::kLong);
        if (sending) {
          send(comm_, h, dst);
        } else {
          at::Tensor theirs = at::zeros({1}, at::kLong);
          recv(comm_, theirs, src);
          if (uint64_t(theirs.item<int64_t>()) != hash) {
            std::string names;
            for (size_t i = a; i < b; ++i) names += " " + plan_.tensors()[size_t(pieces[i].tensor)].name;
            SLIMPI_FAIL("weight update {} arrived corrupted from sync rank {} at sync rank {}: checksum {:016x}, "
                        "the sender's {:016x}; its tensors:{}", *version, src, dst, hash,
                        uint64_t(theirs.item<int64_t>()), names);
          }
        }
      }
    }
    a = b;
  }
  stats.seconds = clock.seconds();
  return stats;
}

}  // namespace slimpi
