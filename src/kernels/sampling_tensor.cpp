#include "kernels/sampling_tensor.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include <algorithm>

#include "kernels/counter_rng.h"

namespace slimpi {
namespace {

// A 64-bit word per element of an int64 tensor. Two's-complement +, ^ and * produce the
// same bits as on uint64_t; the right shift is made logical by masking the sign fill.
struct TensorWord {
  at::Tensor t;  // [N] int64
};
TensorWord operator+(const TensorWord& a, uint64_t c) { return {a.t + static_cast<int64_t>(c)}; }
TensorWord operator*(const TensorWord& a, uint64_t c) { return {a.t * static_cast<int64_t>(c)}; }
TensorWord operator^(const TensorWord& a, const TensorWord& b) { return {at::bitwise_xor(a.t, b.t)}; }
TensorWord logical_shift_right(const TensorWord& a, int n) {
  return {at::bitwise_and(at::bitwise_right_shift(a.t, n), static_cast<int64_t>(~uint64_t(0) >> n))};
}

// [N, 3] int64 on `device`: seed, sample, position per draw (one host-to-device copy).
at::Tensor upload_coordinates(const std::vector<DrawCoordinates>& draws, const at::Device& device) {
  at::Tensor host = at::empty({static_cast<int64_t>(draws.size()), 3}, at::kLong);
  int64_t* p = host.data_ptr<int64_t>();
  for (const auto& d : draws) {
    *p++ = static_cast<int64_t>(d.seed);
    *p++ = static_cast<int64_t>(d.sample);
    *p++ = static_cast<int64_t>(d.position);
  }
  return host.to(device);
}

at::Tensor uniforms_from(const at::Tensor& coordinates) {  // [N, 3] -> [N] f64
  TensorWord bits = counter_bits(TensorWord{coordinates.select(1, 0)}, TensorWord{coordinates.select(1, 1)},
                                 TensorWord{coordinates.select(1, 2)});
  return bits.t.to(at::kDouble) * kCounterUnit;
}

}  // namespace

at::Tensor counter_uniforms_tensor(const std::vector<DrawCoordinates>& draws, const at::Device& device) {
  return uniforms_from(upload_coordinates(draws, device));
}

SampledTokens sample_tokens_tensor(const at::Tensor& logits, const std::vector<SamplingRow>& rows,
                                   const std::vector<DrawCoordinates>& draws) {
  const int64_t R = logits.size(0), V = logits.size(1);
  SLIMPI_CHECK(int64_t(rows.size()) == R && int64_t(draws.size()) == R,
               "sample_tokens_tensor: {} rows of logits, {} sampling rows, {} draws", R, rows.size(), draws.size());
  const at::Device device = logits.device();

  // Per-row settings, one upload each: [R] int64 top_k, [2, R] f64 temperature and top_p.
  std::vector<int64_t> top_k_host(R);
  std::vector<double> real_host(2 * R);
  std::vector<uint8_t> greedy_host(R);
  bool any_sorted = false;
  for (int64_t b = 0; b < R; ++b) {
    const SamplingRow& r = rows[b];
    top_k_host[b] = r.top_k;
    real_host[b] = r.temperature > 0 ? r.temperature : 1.0;
    real_host[R + b] = r.top_p;
    greedy_host[b] = r.temperature <= 0;
    any_sorted |= r.temperature > 0 && (r.top_k > 0 || r.top_p < 1.0);
  }
  const at::Tensor z = logits.to(at::kFloat);  // [R, V]
  const at::Tensor greedy = z.argmax(1);       // [R]: the first of equal maxima
  if (std::all_of(greedy_host.begin(), greedy_host.end(), [](uint8_t g) { return g; }))
    return {greedy, at::zeros({R}, greedy.options())};
  const at::Tensor is_greedy = at::tensor(greedy_host, at::kByte).to(device).to(at::kBool);  // [R]
  const at::Tensor top_k = at::tensor(top_k_host, at::kLong).to(device);                 // [R]
  const at::Tensor real = at::tensor(real_host, at::kDouble).view({2, R}).to(device);
  const at::Tensor temperature = real[0].unsqueeze(1), top_p = real[1];            // [R, 1], [R]
  const at::Tensor u = uniforms_from(upload_coordinates(draws, device));           // [R]
  const at::Tensor position = at::arange(V, top_k.options()).unsqueeze(0);         // [1, V]

  // Candidate order: index order, or z descending with ties to the lower index (a
  // stable descending sort) where top_k or top_p cuts.
  const at::Tensor zd = z.to(at::kDouble);  // [R, V]
  at::Tensor order = position.expand({R, V});
  if (any_sorted) {
    const at::Tensor cuts = ((top_k > 0) | (top_p < 1.0)).unsqueeze(1);  // [R, 1]
    at::Tensor sorted_index = std::get<1>(z.sort(/*stable=*/true, /*dim=*/1, /*descending=*/true));
    order = at::where(cuts, sorted_index, order);
  }
  const at::Tensor zo = zd.gather(1, order);                          // [R, V] candidates in order
  const at::Tensor zmax = zd.amax(1, /*keepdim=*/true);               // [R, 1]
  const at::Tensor n = at::where((top_k > 0) & (top_k < V), top_k, at::full_like(top_k, V));  // [R]
  const at::Tensor in_cut = position < n.unsqueeze(1);                // [R, V]
  const at::Tensor cumulative = (at::exp((zo - zmax) / temperature) * in_cut).cumsum(1);  // [R, V]
  const at::Tensor total = cumulative.select(1, V - 1);               // [R]: the mass of the cut

  // top_p: the shortest prefix whose mass reaches top_p · total.
  const at::Tensor short_of_p = ((cumulative < (top_p * total).unsqueeze(1)) & in_cut).sum(1) + 1;
  const at::Tensor keep = at::where(top_p < 1.0, at::minimum(short_of_p, n), n);  // [R] >= 1
  const at::Tensor kept_mass = cumulative.gather(1, (keep - 1).unsqueeze(1)).squeeze(1);
  // The first candidate whose cumulative mass exceeds u · mass (the last if none does).
  const at::Tensor below = ((cumulative <= (u * kept_mass).unsqueeze(1)) & (position < keep.unsqueeze(1))).sum(1);
  const at::Tensor chosen = at::minimum(below, keep - 1);
  const at::Tensor sampled = order.gather(1, chosen.unsqueeze(1)).squeeze(1);
  const at::Tensor support = at::where(keep < V, keep, at::zeros_like(keep));
  return {at::where(is_greedy, greedy, sampled), at::where(is_greedy, at::zeros_like(support), support)};
}

}  // namespace slimpi
