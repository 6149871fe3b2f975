// Block-wise FP8 weights (rollout.precision = "fp8"): DeepSeek-V3's layout, as Hugging
// Face FP8 checkpoints (quantization_config {quant_method "fp8", fmt "e4m3",
// weight_block_size [128, 128]}) and slime's sync (quantizer_fp8.py) store them.
//
// A weight W [N, K] becomes q [N, K] float8_e4m3fn and one fp32 scale per 128 x 128
// block, scale_inv [ceil(N / 128), ceil(K / 128)] (the last row/column of blocks may be
// partial). For block (i, j):
//     amax = max(|W| over the block, 1e-10)          (fp32)
//     s    = amax / 448                              (448: e4m3's largest finite value)
//     q    = e4m3(clamp(W * (1 / s), -448, 448))     (round to nearest even)
//     W'   = q * s                                   (de-quantised, fp32, then to the engine's dtype)
// the formula of slime's blockwise_cast_to_fp8 kernel. Which tensors: every linear
// projection's weight (attention q/k/v/o, MLP gate/up/down, experts', the MTP layers'
// projections); never embeddings, the LM head, norms, biases or an MoE router.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace slimpi {

inline constexpr int64_t kFp8BlockSize = 128;
inline constexpr double kE4m3Max = 448.0;

struct Fp8Blocks {
  at::Tensor q;          // [N, K] float8_e4m3fn
  at::Tensor scale_inv;  // [ceil(N / 128), ceil(K / 128)] fp32
};

// Whether parameter `name` (slimpi's Hugging Face-style name) is held in FP8 by an fp8
// engine: the linear projections, "*_proj.weight" and latent attention's
// "kv_a_proj_with_mqa.weight" (DeepSeek-V3's FP8 checkpoints hold exactly these in e4m3).
bool is_fp8_weight(const std::string& name);
// The name of `weight_name`'s block scales: "x.weight" -> "x.weight_scale_inv".
std::string fp8_scale_name(const std::string& weight_name);
// The scale grid of a [rows, cols] weight: {ceil(rows / 128), ceil(cols / 128)}.
std::vector<int64_t> fp8_scale_shape(int64_t rows, int64_t cols);

// w [N, K] (any floating dtype, any device) -> its blocks, on w's device.
Fp8Blocks quantize_fp8_blocks(const at::Tensor& w);
// q [N, K] e4m3 and scale_inv [ceil(N/128), ceil(K/128)] fp32 -> W' [N, K] in `dtype`
// (computed in fp32, rounded once). Writes into `out` when given (its dtype and shape).
at::Tensor dequantize_fp8_blocks(const at::Tensor& q, const at::Tensor& scale_inv, at::ScalarType dtype);
void dequantize_fp8_blocks_into(const at::Tensor& q, const at::Tensor& scale_inv, at::Tensor& out);

}  // namespace slimpi
