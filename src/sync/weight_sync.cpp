#include "sync/weight_sync.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>

#include <fmt/ranges.h>

#include <climits>

#include "core/log.h"
#include "core/timer.h"
#include "parallel/comm_tensor.h"
#include "sync/weight_delta.h"

namespace slimpi {
namespace {

std::string describe(const std::vector<NamedTensor>& params) {
  std::string h;
  for (const auto& p : params)
    h += fmt::format("{} {} {}\n", p.name, std::string(c10::toString(p.tensor.scalar_type())),
                     fmt::join(p.tensor.sizes(), "x"));
  return h;
}

}  // namespace

uint64_t fnv1a(uint64_t h, const uint8_t* data, int64_t n) {
  for (int64_t i = 0; i < n; ++i) h = (h ^ data[i]) * 0x100000001b3ULL;
  return h;
}

WeightImage weight_image(const Transformer& model, at::ScalarType dtype) {
  if (model.weight_dtype() == dtype) return {model.flat_parameters(), model.parameters()};
  WeightImage image;
  at::NoGradGuard no_grad;
  image.flat = model.flat_parameters().to(dtype);
  int64_t offset = 0;
  for (const auto& p : model.parameters()) {
    image.params.push_back({p.name, image.flat.narrow(0, offset, p.tensor.numel()).view(p.tensor.sizes())});
    offset += p.tensor.numel();
  }
  return image;
}

WeightSync::WeightSync(Comm& sync, int64_t bucket_bytes, DeltaSyncConfig delta) : comm_(sync), versions_(delta) {
  SLIMPI_CHECK(bucket_bytes > 0, "weight sync bucket of {} bytes", bucket_bytes);
  bucket_ = at::empty({bucket_bytes}, at::TensorOptions().dtype(at::kByte).device(
                                          sync.device_memory() ? at::Device(at::kCUDA) : at::Device(at::kCPU)));
}

void WeightSync::agree_on_tensors(const std::vector<NamedTensor>& params, int64_t* version) {
  const bool root = comm_.rank() == 0;
  // Header: version + the tensor list; receivers must agree with it exactly.
  std::string header = root ? fmt::format("{}\n{}", *version, describe(params)) : std::string();
  broadcast_bytes(comm_, header, 0);
  const size_t newline = header.find('\n');
  const std::string mine = describe(params);
  const bool matches = root || header.substr(newline + 1) == mine;
  // Agree before any bucket moves, so that a mismatch stops every rank, none waits.
  at::Tensor ok = at::full({1}, matches ? 1 : 0, at::kInt);
  allreduce(comm_, ok, ReduceOp::Min);
  if (!matches)
    SLIMPI_FAIL("weight sync: the trainer's tensors differ from this engine's model:\ntrainer:\n{}engine:\n{}",
                header.substr(newline + 1), mine);
  if (ok.item<int>() == 0)
    SLIMPI_FAIL("weight sync (comm '{}') refused by an engine whose model differs from the trainer's "
                "(its error names the tensors)", comm_.name());
  if (!root) *version = std::stoll(header.substr(0, newline));
}

void WeightSync::broadcast_packed(const std::vector<NamedTensor>& params,
                                  const std::function<void(const at::Tensor&)>& account) {
  // The tensors as one byte stream cut into buckets: packed on the root, unpacked elsewhere.
  const bool root = comm_.rank() == 0;
  const int64_t capacity = bucket_.numel();
  size_t tensor = 0;
  int64_t offset_in_tensor = 0;
  while (tensor < params.size()) {
    // Plan this bucket: (tensor index, byte offset in tensor, bytes, offset in bucket).
    struct Piece { size_t t; int64_t from, n, at; };
    std::vector<Piece> pieces;
    int64_t used = 0;
    while (tensor < params.size() && used < capacity) {
      const at::Tensor& p = params[tensor].tensor;
      const int64_t total = p.numel() * static_cast<int64_t>(p.element_size());
      const int64_t n = std::min(total - offset_in_tensor, capacity - used);
      pieces.push_back({tensor, offset_in_tensor, n, used});
      used += n;
      offset_in_tensor += n;
      if (offset_in_tensor == total) {
        ++tensor;
        offset_in_tensor = 0;
      }
    }
    at::Tensor bucket = bucket_.narrow(0, 0, used);
    if (root)
      for (const auto& pc : pieces) {
        at::Tensor bytes = params[pc.t].tensor.detach().contiguous().view({-1}).view(at::kByte);
        bucket.narrow(0, pc.at, pc.n).copy_(bytes.narrow(0, pc.from, pc.n));
      }
    broadcast(comm_, bucket, 0);
    if (!root)
      for (const auto& pc : pieces) {
        at::Tensor dst = params[pc.t].tensor.detach().view({-1}).view(at::kByte);  // aliases the parameter
        dst.narrow(0, pc.from, pc.n).copy_(bucket.narrow(0, pc.at, pc.n));
      }
    account(bucket);
  }
}

bool WeightSync::send_delta(const at::Tensor& bytes, int64_t version, int64_t element_size, WeightSyncStats& stats) {
  const bool root = comm_.rank() == 0;
  // Buckets of whole elements, fewer than 2^31 of them (the sparse form's int32 indices).
  const int64_t total = bytes.numel(),
                capacity = std::min(bucket_.numel() / element_size, int64_t(INT32_MAX)) * element_size;
  const at::TensorOptions host_long = at::TensorOptions().dtype(at::kLong);
  int64_t changed = 0;
  for (int64_t start = 0; start < total; start += capacity) {
    const int64_t n = std::min(capacity, total - start);
    const at::Tensor mine = bytes.narrow(0, start, n);
    BucketDelta d;
    if (root) d = encode_bucket(mine, last_.narrow(0, start, n), element_size);
    at::Tensor header = at::tensor({int64_t(d.kind), d.changed, root ? d.payload.numel() : 0}, host_long);
    broadcast(comm_, header, 0);
    const int64_t* h = header.data_ptr<int64_t>();
    at::Tensor payload = root ? d.payload.contiguous() : at::empty({h[2]}, bucket_.options());
    if (payload.device() != bucket_.device()) payload = payload.to(bucket_.device());
    broadcast(comm_, payload, 0);
    if (root)
      last_.narrow(0, start, n).copy_(mine);
    else
      apply_bucket(mine, DeltaKind(h[0]), h[1], payload.to(mine.device()), element_size);
    changed += h[1];
    stats.bytes += payload.numel() + header.numel() * 8;
    ++stats.n_buckets;
  }
  stats.density = total > 0 ? double(changed) / double(total / element_size) : 0.0;
  if (comm_.rank() == 1 && delta_corruption_due(version)) {
    log::warn("fault injection: flipping a byte of version {}'s weights after its delta", version);
    at::Tensor b = bytes.narrow(0, 0, 1);
    b.bitwise_xor_(1);
  }
  // Every engine's result against what the root sent.
  at::Tensor hash = at::tensor({int64_t(xxh3_of(bytes))}, host_long);
  at::Tensor roots = hash.clone();
  broadcast(comm_, roots, 0);
  const bool same = roots.item<int64_t>() == hash.item<int64_t>();
  at::Tensor bad = at::tensor({int64_t(!same)}, host_long);
  allreduce(comm_, bad, ReduceOp::Max);
  if (!same)
    log::warn("weight sync: version {} after its delta differs from the trainer's (XXH3 {:016x}, the trainer's "
              "{:016x}); the whole model is sent again", version, uint64_t(hash.item<int64_t>()),
              uint64_t(roots.item<int64_t>()));
  stats.checksum = uint64_t(hash.item<int64_t>());  // this rank's XXH3: the root's on every rank that passed
  return bad.item<int64_t>() == 0;
}

WeightSyncStats WeightSync::sync(const std::vector<NamedTensor>& params, int64_t* version, bool checksum,
                                 const at::Tensor& flat) {
  Stopwatch clock;
  agree_on_tensors(params, version);
  WeightSyncStats stats;
  const int64_t capacity = bucket_.numel();
  uint64_t hash = kFnvOffset;
  at::NoGradGuard no_grad;
  int64_t param_bytes = 0;
  for (const auto& p : params) param_bytes += p.tensor.numel() * static_cast<int64_t>(p.tensor.element_size());
  const bool in_place = flat.defined() && flat.is_contiguous() && flat.device() == bucket_.device() &&
                        flat.numel() * static_cast<int64_t>(flat.element_size()) == param_bytes;
  const at::Tensor flat_bytes = in_place ? flat.detach().view({-1}).view(at::kByte) : at::Tensor();
  if (versions_.enabled() && versions_.delta_possible(comm_, in_place)) {
    stats.anchor = false;
    if (send_delta(flat_bytes, *version, int64_t(flat.element_size()), stats)) {
      versions_.delta_sent(*version);
      if (!checksum) stats.checksum = 0;
      stats.seconds = clock.seconds();
      return stats;
    }
    stats.resent = true;  // then whole, below
  }
  auto account = [&](const at::Tensor& bucket) {  // after each bucket's broadcast
    if (checksum) {
      at::Tensor host = bucket.cpu();
      hash = fnv1a(hash, host.data_ptr<uint8_t>(), host.numel());
    }
    stats.bytes += bucket.numel();
    ++stats.n_buckets;
  };
  if (in_place) {  // the parameters' own storage, bucket by bucket
    for (int64_t start = 0; start < param_bytes; start += capacity) {
      at::Tensor bucket = flat_bytes.narrow(0, start, std::min(capacity, param_bytes - start));
      broadcast(comm_, bucket, 0);
      account(bucket);
    }
  } else {
    broadcast_packed(params, account);
  }
  if (versions_.enabled()) {  // an anchor: every copy now holds this version
    stats.anchor = true;
    stats.density = 1;
    versions_.whole_sent(*version, in_place);
    if (comm_.rank() == 0 && in_place) last_ = flat_bytes.clone();
  }
  stats.checksum = checksum ? hash : 0;
  stats.seconds = clock.seconds();
  return stats;
}

}  // namespace slimpi
