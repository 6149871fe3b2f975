#include "model/fp8_blocks.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include <fmt/ranges.h>

#include <vector>

namespace slimpi {
namespace {

int64_t blocks(int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }

// [N, K] -> [N, K] with each block's value of `per_block` [nb, kb] repeated over it.
at::Tensor spread(const at::Tensor& per_block, int64_t rows, int64_t cols) {
  return per_block.repeat_interleave(kFp8BlockSize, 0)
      .repeat_interleave(kFp8BlockSize, 1)
      .narrow(0, 0, rows)
      .narrow(1, 0, cols);
}

void check_blocks(const at::Tensor& q, const at::Tensor& scale_inv) {
  SLIMPI_CHECK(q.dim() == 2 && q.scalar_type() == at::kFloat8_e4m3fn, "fp8 blocks: q must be [N, K] float8_e4m3fn");
  SLIMPI_CHECK(scale_inv.scalar_type() == at::kFloat &&
                   scale_inv.sizes().vec() == fp8_scale_shape(q.size(0), q.size(1)),
               "fp8 blocks: a {}x{} weight needs {}x{} fp32 block scales, not {} {}", q.size(0), q.size(1),
               blocks(q.size(0)), blocks(q.size(1)), std::string(c10::toString(scale_inv.scalar_type())),
               fmt::join(scale_inv.sizes(), "x"));
}

}  // namespace

bool is_fp8_weight(const std::string& name) {
  for (const std::string tail : {"_proj.weight", "_proj_with_mqa.weight"})
    if (name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0) return true;
  return false;
}

std::string fp8_scale_name(const std::string& weight_name) { return weight_name + "_scale_inv"; }

std::vector<int64_t> fp8_scale_shape(int64_t rows, int64_t cols) { return {blocks(rows), blocks(cols)}; }

Fp8Blocks quantize_fp8_blocks(const at::Tensor& w) {
  SLIMPI_CHECK(w.dim() == 2 && at::isFloatingType(w.scalar_type()), "fp8 blocks: quantising a {}-d {} tensor",
               w.dim(), std::string(c10::toString(w.scalar_type())));
  const int64_t n = w.size(0), k = w.size(1), nb = blocks(n), kb = blocks(k);
  // Zero-pad to whole blocks (zeros never raise a block's amax), view as [nb, 128, kb, 128].
  at::Tensor x = at::zeros({nb * kFp8BlockSize, kb * kFp8BlockSize}, w.options().dtype(at::kFloat));
  x.narrow(0, 0, n).narrow(1, 0, k).copy_(w);
  at::Tensor amax = x.view({nb, kFp8BlockSize, kb, kFp8BlockSize}).abs().amax({1, 3}).clamp_min(1e-10);  // [nb, kb]
  at::Tensor s = amax / kE4m3Max;
  at::Tensor inv = at::reciprocal(s);
  at::Tensor q = (x.narrow(0, 0, n).narrow(1, 0, k) * spread(inv, n, k)).clamp(-kE4m3Max, kE4m3Max);
  return {q.to(at::kFloat8_e4m3fn).contiguous(), s.contiguous()};
}

void dequantize_fp8_blocks_into(const at::Tensor& q, const at::Tensor& scale_inv, at::Tensor& out) {
  check_blocks(q, scale_inv);
  SLIMPI_CHECK(out.sizes() == q.sizes(), "fp8 blocks: de-quantising {} into {}", fmt::join(q.sizes(), "x"),
               fmt::join(out.sizes(), "x"));
  out.copy_(q.to(at::kFloat) * spread(scale_inv.to(q.device()), q.size(0), q.size(1)));
}

at::Tensor dequantize_fp8_blocks(const at::Tensor& q, const at::Tensor& scale_inv, at::ScalarType dtype) {
  at::Tensor out = at::empty(q.sizes(), q.options().dtype(dtype));
  dequantize_fp8_blocks_into(q, scale_inv, out);
  return out;
}

}  // namespace slimpi
