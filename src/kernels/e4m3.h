// e4m3 (OCP FP8 E4M3FN: 1 sign bit, 4 exponent bits of bias 7, 3 mantissa bits; no
// infinities, S.1111.111 is NaN) to fp32 by bit arithmetic: no table lookup, so a loop
// over codes vectorises. Exactly c10::Float8_e4m3fn's conversion for every non-NaN code
// (tested for all 254; the two NaN codes give a quiet NaN, not torch's NaN bit pattern).
//   e > 0:  (-1)^s 2^(e - 7) (1 + m / 8)  -> fp32 exponent e - 7 + 127, mantissa m << 20
//   e = 0:  (-1)^s 2^-6 (m / 8) = m 2^-9  -> a normal fp32, exact
#pragma once

#include <c10/util/BFloat16.h>

#include <bit>
#include <cstdint>

namespace slimpi {

[[gnu::always_inline]] inline float e4m3_to_float(uint8_t code) {
  const uint32_t mag = code & 0x7fu, sign = uint32_t(code & 0x80u) << 24;
  const uint32_t normal = (mag << 20) + (120u << 23);
  const uint32_t subnormal = std::bit_cast<uint32_t>(float(mag) * 0x1p-9f);
  uint32_t bits = (mag >> 3) ? normal : subnormal;
  if (mag == 0x7fu) bits = 0x7fc00000u;  // NaN
  return std::bit_cast<float>(bits | sign);
}

// Rows of e4m3 codes [n, Hkv, D] times their kv head's scale [Hkv] -> out [n, Hkv, D],
// fp32 or bf16 (the fp32 product rounded to nearest even): what
// (codes.to(float) * scale).to(out's dtype) gives, in one vectorised pass (an e4m3 KV
// cache's gathered rows, model/kv_cache.h).
void e4m3_rows_to_float(const uint8_t* codes, int64_t n, int64_t Hkv, int64_t D, const float* scale, float* out);
void e4m3_rows_to_bf16(const uint8_t* codes, int64_t n, int64_t Hkv, int64_t D, const float* scale,
                       c10::BFloat16* out);

}  // namespace slimpi
