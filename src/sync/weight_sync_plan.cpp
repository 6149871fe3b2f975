#include "sync/weight_sync_plan.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <climits>
#include <map>
#include <sstream>
#include <tuple>

#include "core/log.h"
#include "core/timer.h"
#include "model/tensor_shard.h"
#include "model/transformer.h"
#include "parallel/comm.h"
#include "parallel/comm_tensor.h"
#include "sync/weight_delta.h"

namespace slimpi {
namespace {

// The rows [begin, end) along the split dimension that shard `rank` of `size` holds of a
// tensor whose whole extent there is `whole` (padded to `padded` when split); everything
// when the tensor is not split at this size. Replicated key/value heads: its part's rows.
struct Held {
  int64_t begin = 0, end = 0, origin = 0;  // origin: the whole index of the shard's local row 0
};
Held held(const ParameterSplit& split, int64_t whole, int rank, int size) {
  if (!split.split()) return {0, whole, 0};
  const int64_t n = split.part_extent(size), origin = n * split.part_of_rank(rank);
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
          // A part the trainer holds on several ranks (replicated key/value heads) is sent by
          // one of them, spread over the engine ranks that want it.
          for (int k = 0; k < t; ++k) {
            if (k % ts.replicas != (engine * e + j) % ts.replicas) continue;
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

SlicedWeightSync::SlicedWeightSync(Comm& sync, const ModelConfig& cfg, const SyncLayout& layout, int64_t bucket_bytes,
                                   DeltaSyncConfig delta)
    : comm_(sync), cfg_(cfg), layout_(layout), bucket_bytes_(bucket_bytes), versions_(delta) {
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

// This rank's view of piece p in its tensor (the sender's: origin src_origin; the
// receiver's: dst_origin), checked against the plan.
at::Tensor SlicedWeightSync::local_part(const LocalTensors& local, const WeightPiece& p, bool sender) const {
  const WholeTensor& w = plan_.tensors()[size_t(p.tensor)];
  auto it = local.find(w.name);
  SLIMPI_CHECK(it != local.end(), "weight sync: sync rank {} lacks {} (the plan moves its rows {}..{})", comm_.rank(),
               w.name, p.begin, p.end - 1);
  const at::Tensor& t = *it->second;
  const int64_t first = p.begin - (sender ? p.src_origin : p.dst_origin);
  SLIMPI_CHECK(t.dim() == int64_t(w.shape.size()) && t.dim() > p.dim && first >= 0 &&
                   first + p.end - p.begin <= t.size(p.dim),
               "weight sync: {} on sync rank {} has shape {}, which does not hold rows {}..{} of the whole {}", w.name,
               comm_.rank(), fmt::format("{}", fmt::join(t.sizes(), "x")), p.begin, p.end - 1,
               fmt::format("{}", fmt::join(w.shape, "x")));
  return t.detach().narrow(p.dim, first, p.end - p.begin);
}

std::vector<std::vector<SlicedWeightSync::Span>> SlicedWeightSync::buckets_of(size_t first, size_t last,
                                                                              int64_t elem) const {
  std::vector<std::vector<Span>> buckets(1);
  int64_t used = 0;
  for (size_t i = first; i < last; ++i) {
    const int64_t total = plan_.pieces()[i].numel * elem;
    for (int64_t from = 0; from < total;) {
      if (used == bucket_bytes_) {
        buckets.emplace_back();
        used = 0;
      }
      const int64_t n = std::min(total - from, bucket_bytes_ - used);
      buckets.back().push_back({i, from, n, used});
      used += n;
      from += n;
    }
  }
  return buckets;
}

uint64_t SlicedWeightSync::send_pair(const LocalTensors& local, size_t first, size_t last, at::ScalarType wire,
                                     WeightSyncStats& stats) {
  const int dst = plan_.pieces()[first].dst;
  uint64_t hash = kFnvOffset;
  size_t converted_piece = last;  // the piece whose wire bytes are at hand (it may span buckets)
  at::Tensor converted;
  for (const std::vector<Span>& spans : buckets_of(first, last, int64_t(c10::elementSize(wire)))) {
    const at::Tensor bucket = bucket_.narrow(0, 0, spans.back().at + spans.back().n);
    for (const Span& s : spans) {
      if (converted_piece != s.piece) {
        converted = local_part(local, plan_.pieces()[s.piece], true).to(wire).contiguous().view({-1}).view(at::kByte);
        converted_piece = s.piece;
      }
      bucket.narrow(0, s.at, s.n).copy_(converted.narrow(0, s.from, s.n));
    }
    send(comm_, bucket, dst);
    hash = hash_bucket(hash, bucket);
    ++stats.n_buckets;
  }
  return hash;
}

uint64_t SlicedWeightSync::receive_pair(const LocalTensors& local, size_t first, size_t last, at::ScalarType wire,
                                        WeightSyncStats& stats) {
  const int src = plan_.pieces()[first].src;
  const int64_t elem = int64_t(c10::elementSize(wire));
  uint64_t hash = kFnvOffset;
  at::Tensor arriving;  // [piece bytes] uint8: the wire bytes of a piece that spans buckets
  for (const std::vector<Span>& spans : buckets_of(first, last, elem)) {
    const at::Tensor bucket = bucket_.narrow(0, 0, spans.back().at + spans.back().n);
    recv(comm_, bucket, src);
    for (const Span& s : spans) {
      const WeightPiece& p = plan_.pieces()[s.piece];
      const int64_t total = p.numel * elem;
      if (s.from == 0) arriving = at::empty({total}, bucket.options());
      arriving.narrow(0, s.from, s.n).copy_(bucket.narrow(0, s.at, s.n));
      if (s.from + s.n < total) continue;  // the rest comes in the next bucket
      const at::Tensor target = local_part(local, p, false);
      target.copy_(arriving.view(wire).view(target.sizes()));
    }
    hash = hash_bucket(hash, bucket);
    ++stats.n_buckets;
  }
  return hash;
}

uint64_t SlicedWeightSync::hash_bucket(uint64_t hash, const at::Tensor& bucket) const {
  if (!checksum_) return hash;
  const at::Tensor host = bucket.cpu();
  return fnv1a(hash, host.data_ptr<uint8_t>(), host.numel());
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
  checksum_ = checksum;
  LocalTensors by_name;
  for (const auto& p : local) by_name[p.name] = &p.tensor;
  const std::vector<WeightPiece>& pieces = plan_.pieces();
  WeightSyncStats stats;
  if (versions_.enabled() && versions_.delta_possible(comm_, true)) {
    if (send_deltas(by_name, wire, *version, stats)) {
      versions_.delta_sent(*version);
      stats.anchor = false;
      stats.seconds = clock.seconds();
      return stats;
    }
    stats = WeightSyncStats();
    stats.resent = true;  // then whole, below
  }
  stats.bytes = plan_.total_elements() * int64_t(c10::elementSize(wire));
  // Pairs in the plan's (receiver, sender) order; each pair's pieces back to back in buckets.
  const int me = comm_.rank();
  for (size_t a = 0; a < pieces.size();) {
    const size_t b = pair_end(a);
    const int src = pieces[a].src, dst = pieces[a].dst;
    if (src == me) {
      const uint64_t hash = send_pair(by_name, a, b, wire, stats);
      if (checksum) send(comm_, at::full({1}, int64_t(hash), at::kLong), dst);
    } else if (dst == me) {
      const uint64_t hash = receive_pair(by_name, a, b, wire, stats);
      if (checksum) {
        at::Tensor theirs = at::zeros({1}, at::kLong);
        recv(comm_, theirs, src);
        if (uint64_t(theirs.item<int64_t>()) != hash) {
          std::string names;
          for (size_t i = a; i < b; ++i) names += " " + plan_.tensors()[size_t(pieces[i].tensor)].name;
          SLIMPI_FAIL("weight update {} arrived corrupted from sync rank {} at sync rank {}: checksum {:016x}, the "
                      "sender's {:016x}; its tensors:{}", *version, src, dst, hash, uint64_t(theirs.item<int64_t>()),
                      names);
        }
      }
    }
    a = b;
  }
  if (versions_.enabled()) {  // an anchor: every member now holds this version
    remember_sent(by_name, wire);
    versions_.whole_sent(*version, true);
  }
  stats.seconds = clock.seconds();
  return stats;
}

at::Tensor SlicedWeightSync::pair_stream(const LocalTensors& local, size_t first, size_t last, at::ScalarType wire,
                                         bool sender) const {
  std::vector<at::Tensor> parts;
  for (size_t i = first; i < last; ++i)
    parts.push_back(local_part(local, plan_.pieces()[i], sender).to(wire).contiguous().view({-1}).view(at::kByte));
  return at::cat(parts).to(bucket_.device());
}

void SlicedWeightSync::unpack_stream(const LocalTensors& local, size_t first, size_t last, at::ScalarType wire,
                                     const at::Tensor& bytes) const {
  const int64_t elem = int64_t(c10::elementSize(wire));
  int64_t at = 0;
  for (size_t i = first; i < last; ++i) {
    const WeightPiece& p = plan_.pieces()[i];
    const at::Tensor target = local_part(local, p, false);
    target.copy_(bytes.narrow(0, at, p.numel * elem).view(wire).view(target.sizes()));
    at += p.numel * elem;
  }
}

void SlicedWeightSync::remember_sent(const LocalTensors& local, at::ScalarType wire) {
  const std::vector<WeightPiece>& pieces = plan_.pieces();
  for (size_t a = 0; a < pieces.size();) {
    const size_t b = pair_end(a);
    if (pieces[a].src == comm_.rank()) sent_[a] = pair_stream(local, a, b, wire, true);
    a = b;
  }
}

size_t SlicedWeightSync::pair_end(size_t first) const {
  const std::vector<WeightPiece>& pieces = plan_.pieces();
  size_t last = first;
  while (last < pieces.size() && pieces[last].dst == pieces[first].dst && pieces[last].src == pieces[first].src) ++last;
  return last;
}

bool SlicedWeightSync::send_deltas(const LocalTensors& local, at::ScalarType wire, int64_t version,
                                   WeightSyncStats& stats) {
  const std::vector<WeightPiece>& pieces = plan_.pieces();
  const int me = comm_.rank();
  const int64_t elem = int64_t(c10::elementSize(wire));
  const int64_t chunk = std::min(bucket_bytes_ / elem, int64_t(INT32_MAX)) * elem;  // whole elements, < 2^31
  int64_t changed = 0, bad = 0;
  for (size_t a = 0; a < pieces.size();) {
    const size_t b = pair_end(a);
    const int src = pieces[a].src, dst = pieces[a].dst;
    if (src == me) {
      const at::Tensor now = pair_stream(local, a, b, wire, true), &before = sent_.at(a);
      for (int64_t start = 0; start < now.numel(); start += chunk) {
        const int64_t n = std::min(chunk, now.numel() - start);
        const BucketDelta d = encode_bucket(now.narrow(0, start, n), before.narrow(0, start, n), elem);
        send(comm_, at::tensor({int64_t(d.kind), d.changed, d.payload.numel()}, at::kLong), dst);
        if (d.payload.numel() > 0) send(comm_, d.payload.contiguous(), dst);
        changed += d.changed;
        stats.bytes += d.payload.numel() + 24;
        ++stats.n_buckets;
      }
      send(comm_, at::tensor({int64_t(xxh3_of(now))}, at::kLong), dst);
      sent_[a] = now;
    } else if (dst == me) {
      const at::Tensor mine = pair_stream(local, a, b, wire, false);
      for (int64_t start = 0; start < mine.numel(); start += chunk) {
        const int64_t n = std::min(chunk, mine.numel() - start);
        at::Tensor header = at::zeros({3}, at::kLong);
        recv(comm_, header, src);
        const int64_t* h = header.data_ptr<int64_t>();
        at::Tensor payload = at::empty({h[2]}, bucket_.options());
        if (h[2] > 0) recv(comm_, payload, src);
        apply_bucket(mine.narrow(0, start, n), DeltaKind(h[0]), h[1], payload, elem);
      }
      if (me == layout_.n_trainer_members() && bad == 0 && delta_corruption_due(version)) {
        log::warn("fault injection: flipping a byte of version {}'s weights from sync rank {} after its delta",
                  version, src);
        mine.narrow(0, 0, 1).bitwise_xor_(1);
      }
      at::Tensor theirs = at::zeros({1}, at::kLong);
      recv(comm_, theirs, src);
      if (uint64_t(theirs.item<int64_t>()) == xxh3_of(mine)) {
        unpack_stream(local, a, b, wire, mine);
      } else {
        bad = 1;
        log::warn("weight sync: version {} from sync rank {} after its delta differs from the sender's (XXH3); the "
                  "whole model is sent again", version, src);
      }
    }
    a = b;
  }
  // Density over every pair; any receiver's failed check sends everything again.
  at::Tensor flags = at::tensor({bad}, at::kLong);
  allreduce(comm_, flags, ReduceOp::Max);
  at::Tensor sums = at::tensor({changed}, at::kLong);
  allreduce(comm_, sums);
  stats.density = double(sums.item<int64_t>()) / double(std::max<int64_t>(1, plan_.total_elements()));
  return flags.item<int64_t>() == 0;
}

}  // namespace slimpi
