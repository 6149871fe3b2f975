#include "sync/weight_delta.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "parallel/comm_tensor.h"

namespace slimpi {
namespace {

at::ScalarType word_type(int64_t element_size) {
  switch (element_size) {
    case 1: return at::kByte;
    case 2: return at::kShort;
    case 4: return at::kInt;
  }
  SLIMPI_FAIL("weight delta: elements of {} bytes", element_size);
}

}  // namespace

BucketDelta encode_bucket(const at::Tensor& now, const at::Tensor& before, int64_t element_size) {
  SLIMPI_CHECK(now.numel() == before.numel() && now.numel() % element_size == 0,
               "weight delta: buckets of {} and {} bytes, elements of {}", now.numel(), before.numel(), element_size);
  const at::ScalarType word = word_type(element_size);
  const at::Tensor a = now.view(word), b = before.view(word);  // [E]
  const at::Tensor differs = at::ne(a, b);                      // [E] bool
  BucketDelta d;
  d.changed = differs.sum().item<int64_t>();
  const int64_t sparse_bytes = d.changed * (4 + element_size);
  // XOR + zstd, on the host; kept when smaller than both others.
  const at::Tensor x = at::bitwise_xor(now, before).cpu().contiguous();  // [B] uint8
  std::vector<uint8_t> frame(ZSTD_compressBound(size_t(x.numel())));
  const size_t packed = ZSTD_compress(frame.data(), frame.size(), x.data_ptr<uint8_t>(), size_t(x.numel()), 1);
  SLIMPI_CHECK(!ZSTD_isError(packed), "weight delta: zstd: {}", ZSTD_getErrorName(packed));
  if (int64_t(packed) < std::min(sparse_bytes, now.numel())) {
    d.kind = DeltaKind::XorZstd;
    d.payload = at::from_blob(frame.data(), {int64_t(packed)}, at::kByte).clone().to(now.device());
    return d;
  }
  if (sparse_bytes >= now.numel()) {  // dense enough: the bytes themselves are smaller
    d.kind = DeltaKind::Raw;
    d.payload = now;
    return d;
  }
  const at::Tensor idx = differs.nonzero().view({-1});  // [K] int64
  d.kind = DeltaKind::Sparse;
  d.payload = at::empty({sparse_bytes}, now.options());
  d.payload.narrow(0, 0, 4 * d.changed).view(at::kInt).copy_(idx.to(at::kInt));
  d.payload.narrow(0, 4 * d.changed, element_size * d.changed).view(word).copy_(a.index_select(0, idx));
  return d;
}

void apply_bucket(const at::Tensor& bucket, DeltaKind kind, int64_t changed, const at::Tensor& payload,
                  int64_t element_size) {
  if (kind == DeltaKind::Raw) {
    SLIMPI_CHECK(payload.numel() == bucket.numel(), "weight delta: a raw payload of {} bytes for a bucket of {}",
                 payload.numel(), bucket.numel());
    bucket.copy_(payload);
    return;
  }
  if (kind == DeltaKind::XorZstd) {
    const at::Tensor frame = payload.cpu().contiguous();
    at::Tensor x = at::empty({bucket.numel()}, at::kByte);
    const size_t n = ZSTD_decompress(x.data_ptr<uint8_t>(), size_t(x.numel()), frame.data_ptr<uint8_t>(),
                                     size_t(frame.numel()));
    SLIMPI_CHECK(!ZSTD_isError(n) && int64_t(n) == bucket.numel(),
                 "weight delta: a zstd payload of {} bytes gave {} for a bucket of {} bytes{}", frame.numel(),
                 ZSTD_isError(n) ? 0 : int64_t(n), bucket.numel(),
                 ZSTD_isError(n) ? std::string(" (") + ZSTD_getErrorName(n) + ")" : std::string());
    bucket.bitwise_xor_(x.to(bucket.device()));
    return;
  }
  SLIMPI_CHECK(kind == DeltaKind::Sparse && payload.numel() == changed * (4 + element_size),
               "weight delta: {} bytes for {} changed elements", payload.numel(), changed);
  const at::ScalarType word = word_type(element_size);
  const at::Tensor idx = payload.narrow(0, 0, 4 * changed).view(at::kInt).to(at::kLong);
  const at::Tensor values = payload.narrow(0, 4 * changed, element_size * changed).view(word);
  bucket.view(word).index_copy_(0, idx, values);
}

DeltaVersions::DeltaVersions(DeltaSyncConfig cfg) : cfg_(cfg) {
  SLIMPI_CHECK(!cfg_.enabled || cfg_.anchor_interval >= 1, "weight sync: a delta anchor every {} syncs",
               cfg_.anchor_interval);
}

bool DeltaVersions::delta_possible(Comm& comm, bool have_copy) const {
  // max(-base) = -min(base): all equal when it meets max(base).
  const bool due = comm.rank() == 0 && since_anchor_ + 1 >= cfg_.anchor_interval;
  at::Tensor a = at::tensor({-base_, base_, int64_t(due), int64_t(!have_copy)}, at::kLong);
  allreduce(comm, a, ReduceOp::Max);
  const int64_t* m = a.data_ptr<int64_t>();
  return -m[0] == m[1] && m[1] >= 0 && m[2] == 0 && m[3] == 0;
}

bool delta_corruption_due(int64_t version) {
  const char* at_version = std::getenv("SLIMPI_FAULT_DELTA_CORRUPT_AT");
  return at_version && std::atoll(at_version) == version;
}

uint64_t xxh3_of(const at::Tensor& bytes) {
  const at::Tensor host = bytes.is_cpu() ? bytes.contiguous() : bytes.cpu();
  return XXH3_64bits(host.data_ptr(), size_t(host.numel()) * host.element_size());
}

}  // namespace slimpi
