#include "rollout/kv_transfer.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include "core/byte_codec.h"

namespace slimpi {
namespace {

constexpr uint32_t kKvTransferMagic = 0x4b565432;  // "KVT2" (KVT1: before the linear-layer state)

// The cache's sections in transfer order: K and V of every layer (K alone for a latent
// cache, whose values are its keys), then the routing trace.
std::vector<const at::Tensor*> sections(const KvCache& cache) {
  std::vector<const at::Tensor*> out;
  for (size_t l = 0; l < cache.k.size(); ++l) {
    out.push_back(&cache.k[l]);
    if (!cache.values_are_keys) out.push_back(&cache.v[l]);
  }
  if (cache.routing.defined()) out.push_back(&cache.routing);
  return out;
}

// A section's rows as bytes: [n_slots, bytes a row] (a view; the tensors are contiguous).
at::Tensor byte_rows(const at::Tensor& t) { return t.view(at::kByte).view({t.size(0), -1}); }

// A hybrid model's state tensors in transfer order: each linear layer's conv state, then
// its recurrent state ([n_state_slots, ...] each); const for a const cache.
template <class Cache>
auto state_sections(Cache& cache) {
  std::vector<decltype(&cache.conv_state[0])> out;
  for (size_t l = 0; l < cache.conv_state.size(); ++l) {
    out.push_back(&cache.conv_state[l]);
    out.push_back(&cache.delta_state[l]);
  }
  return out;
}

}  // namespace

KvTransfer gather_kv_rows(const KvCache& cache, int64_t group_index, const std::vector<int64_t>& slots,
                          int64_t state_slot) {
  KvTransfer t;
  t.group_index = group_index;
  t.n_positions = static_cast<int64_t>(slots.size());
  if (state_slot >= 0)
    for (const at::Tensor* s : state_sections(cache)) {
      const at::Tensor row = byte_rows(*s)[state_slot].cpu().contiguous();
      t.state_bytes.push_back(row.numel());
      t.state.append(static_cast<const char*>(row.data_ptr()), size_t(row.numel()));
    }
  const auto secs = sections(cache);
  if (secs.empty()) return t;
  const at::Tensor index = at::tensor(slots, at::kLong).to(secs.front()->device());
  for (const at::Tensor* s : secs) {
    const at::Tensor rows = byte_rows(*s).index_select(0, index).cpu().contiguous();  // [n, row bytes]
    t.row_bytes.push_back(byte_rows(*s).size(1));
    t.payload.append(static_cast<const char*>(rows.data_ptr()), size_t(rows.numel()));
  }
  return t;
}

void scatter_kv_rows(KvCache& cache, const KvTransfer& t, int64_t first, const std::vector<int64_t>& slots) {
  const auto secs = sections(cache);
  SLIMPI_CHECK(t.row_bytes.size() == secs.size(), "group {}: the KV transfer has {} sections, this engine's cache {} "
               "(the prefill and decode engines disagree on the model or the cache)", t.group_index,
               t.row_bytes.size(), secs.size());
  const int64_t m = t.n_positions - first;
  SLIMPI_CHECK(first >= 0 && m >= 0 && int64_t(slots.size()) == m, "group {}: {} slots for positions {}..{} of a "
               "transfer of {}", t.group_index, slots.size(), first, t.n_positions, t.n_positions);
  if (m == 0) return;
  const at::Tensor index = at::tensor(slots, at::kLong).to(secs.front()->device());
  int64_t offset = 0;
  for (size_t i = 0; i < secs.size(); ++i) {
    at::Tensor dest = byte_rows(*secs[i]);
    SLIMPI_CHECK(dest.size(1) == t.row_bytes[i], "group {}: KV transfer section {} has {} bytes a position, this "
                 "engine's cache {} (the prefill and decode engines disagree on the model or the cache dtype)",
                 t.group_index, i, t.row_bytes[i], dest.size(1));
    char* base = const_cast<char*>(t.payload.data()) + offset + first * t.row_bytes[i];
    const at::Tensor rows = at::from_blob(base, {m, t.row_bytes[i]}, at::kByte).to(dest.device());
    dest.index_copy_(0, index, rows);
    offset += t.n_positions * t.row_bytes[i];
  }
}

void scatter_state(KvCache& cache, const KvTransfer& t, int64_t state_slot) {
  const std::vector<at::Tensor*> secs = state_sections(cache);  // (this cache's, written)
  SLIMPI_CHECK(t.state_bytes.size() == secs.size(), "group {}: the KV transfer carries {} linear-layer state tensors, "
               "this engine's cache {} (the prefill and decode engines disagree on the model)", t.group_index,
               t.state_bytes.size(), secs.size());
  int64_t offset = 0;
  for (size_t i = 0; i < secs.size(); ++i) {
    at::Tensor dest = byte_rows(*secs[i])[state_slot];
    SLIMPI_CHECK(dest.numel() == t.state_bytes[i], "group {}: linear-layer state tensor {} of the KV transfer has {} "
                 "bytes, this engine's {}", t.group_index, i, t.state_bytes[i], dest.numel());
    char* base = const_cast<char*>(t.state.data()) + offset;
    dest.copy_(at::from_blob(base, {t.state_bytes[i]}, at::kByte));
    offset += t.state_bytes[i];
  }
}

std::string encode_kv_transfer(const KvTransfer& t) {
  ByteWriter w;
  w.put(kKvTransferMagic);
  w.put(t.group_index);
  w.put(t.n_positions);
  w.put_vector(t.row_bytes);
  w.put_string(t.payload);
  w.put_vector(t.state_bytes);
  w.put_string(t.state);
  return w.take();
}

KvTransfer decode_kv_transfer(const std::string& bytes) {
  ByteReader r(bytes);
  SLIMPI_CHECK(r.get<uint32_t>() == kKvTransferMagic, "a KV transfer message that is not one ({} bytes)", bytes.size());
  KvTransfer t;
  t.group_index = r.get<int64_t>();
  t.n_positions = r.get<int64_t>();
  t.row_bytes = r.get_vector<int64_t>();
  t.payload = r.get_string();
  t.state_bytes = r.get_vector<int64_t>();
  t.state = r.get_string();
  int64_t expected = 0;
  for (int64_t b : t.row_bytes) expected += b * t.n_positions;
  for (int64_t b : t.state_bytes) expected += b;
  SLIMPI_CHECK(r.done() && t.n_positions >= 0 && expected == t.bytes(),
               "group {}: a KV transfer of {} positions carries {} bytes where its sections need {}", t.group_index,
               t.n_positions, t.bytes(), expected);
  return t;
}

}  // namespace slimpi
