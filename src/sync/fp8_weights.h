// FP8 rollout weights (rollout.precision = "fp8"): what the weight sync carries to an
// fp8 engine and how the engine takes it (model/fp8_blocks.h: the block format).
//
// The sync's image of the model ("fp8 image"): every linear projection's weight as its
// e4m3 bytes plus its block scales ("<name>_scale_inv", fp32), every other tensor
// (embeddings, LM head, norms, biases, routers) in bf16: about half the bytes of a bf16
// image. One flat byte buffer, grouped by dtype so that every view is aligned with no
// padding: all scales (fp32) first, then the bf16 tensors, then the e4m3 weights, each
// group in parameter order. The trainer side quantises its fp32 masters into a fresh
// image at every sync (rank 0, or the gathered whole model under model parallelism);
// an engine keeps one image as its received copy (delta sync diffs against it) and
// de-quantises it into its bf16 model after every sync.
//
// On the CPU the engine's products then run in bf16 on the de-quantised weights: the
// numbers an FP8 engine that de-quantises block by block computes, with the bf16
// model's memory and speed (no FP8 matmul on the CPU). A GPU engine would keep the e4m3
// bytes and multiply with scaled FP8 products; that path is not built.
#pragma once

#include "model/transformer.h"
#include "sync/weight_sync.h"

namespace slimpi {

// The fp8 image's layout for `model`'s parameters, on its device: quantised from them
// when `quantize`, zeros otherwise (a buffer to receive into or to fill).
WeightImage fp8_weight_image(const Transformer& model, bool quantize);
// Quantises `model`'s parameters into `image` (fp8_weight_image of a model of the same
// config): the sender's buffer, made once and refilled at every sync.
void fill_fp8_image(const Transformer& model, WeightImage& image);

// Writes `image` (fp8_weight_image of a model of the same config) into `engine`'s
// parameters: linear weights de-quantised, the rest copied.
void load_fp8_image(const WeightImage& image, Transformer& engine);

// engine's parameters <- source's through FP8 (a colocated fp8 engine, the generate
// job): the linear weights quantised and de-quantised, the rest converted. Unsharded
// models of one config.
void copy_through_fp8(const Transformer& source, Transformer& engine);

}  // namespace slimpi
