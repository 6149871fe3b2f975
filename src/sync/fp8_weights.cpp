#include "sync/fp8_weights.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>

#include <map>

#include "model/fp8_blocks.h"
#include "model/precision.h"

namespace slimpi {
namespace {

// One tensor of the image: its name, dtype and shape.
struct ImageEntry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};

// The image's entries in layout order: scales, then bf16 tensors, then e4m3 weights.
std::vector<ImageEntry> image_layout(const Transformer& model) {
  std::vector<ImageEntry> scales, halves, weights;
  for (const auto& p : model.parameters()) {
    if (is_fp8_weight(p.name)) {
      SLIMPI_CHECK(p.tensor.dim() == 2, "fp8 image: '{}' is not a matrix", p.name);
      scales.push_back({fp8_scale_name(p.name), at::kFloat, fp8_scale_shape(p.tensor.size(0), p.tensor.size(1))});
      weights.push_back({p.name, at::kFloat8_e4m3fn, p.tensor.sizes().vec()});
    } else {
      halves.push_back({p.name, at::kBFloat16, p.tensor.sizes().vec()});
    }
  }
  std::vector<ImageEntry> all = std::move(scales);
  all.insert(all.end(), halves.begin(), halves.end());
  all.insert(all.end(), weights.begin(), weights.end());
  return all;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

}  // namespace

WeightImage fp8_weight_image(const Transformer& model, bool quantize) {
  SLIMPI_CHECK(!model.sharded(), "fp8 image: a whole model is needed (this one is a shard)");
  const std::vector<ImageEntry> layout = image_layout(model);
  int64_t total = 0;
  for (const auto& e : layout) total += numel_of(e.shape) * int64_t(c10::elementSize(e.dtype));
  WeightImage image;
  at::NoGradGuard no_grad;
  image.flat = at::zeros({total}, at::TensorOptions().dtype(at::kByte).device(model.device()));
  int64_t offset = 0;
  for (const auto& e : layout) {
    const int64_t bytes = numel_of(e.shape) * int64_t(c10::elementSize(e.dtype));
    image.params.push_back({e.name, image.flat.narrow(0, offset, bytes).view(e.dtype).view(e.shape)});
    offset += bytes;
  }
  if (quantize) fill_fp8_image(model, image);
  return image;
}

void fill_fp8_image(const Transformer& model, WeightImage& image) {
  std::map<std::string, at::Tensor> views;
  for (const auto& p : image.params) views[p.name] = p.tensor;
  at::NoGradGuard no_grad;
  for (const auto& p : model.parameters()) {
    const auto it = views.find(p.name);
    SLIMPI_CHECK(it != views.end(), "fp8 image: no tensor '{}'", p.name);
    if (is_fp8_weight(p.name)) {
      const Fp8Blocks b = quantize_fp8_blocks(p.tensor);
      it->second.copy_(b.q);
      views.at(fp8_scale_name(p.name)).copy_(b.scale_inv);
    } else {
      it->second.copy_(p.tensor);
    }
  }
}

void load_fp8_image(const WeightImage& image, Transformer& engine) {
  std::map<std::string, at::Tensor> views;
  for (const auto& p : image.params) views[p.name] = p.tensor;
  at::NoGradGuard no_grad;
  for (const auto& p : engine.parameters()) {
    at::Tensor dst = p.tensor;
    const auto it = views.find(p.name);
    SLIMPI_CHECK(it != views.end(), "fp8 image: no tensor '{}'", p.name);
    if (is_fp8_weight(p.name))
      dequantize_fp8_blocks_into(it->second, views.at(fp8_scale_name(p.name)), dst);
    else
      dst.copy_(it->second);
  }
}

void copy_through_fp8(const Transformer& source, Transformer& engine) {
  SLIMPI_CHECK(!source.sharded() && !engine.sharded() && source.parameters().size() == engine.parameters().size(),
               "copy_through_fp8: unsharded models of one config are needed");
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < source.parameters().size(); ++i) {
    const NamedTensor& s = source.parameters()[i];
    at::Tensor dst = engine.parameters()[i].tensor;
    if (is_fp8_weight(s.name)) {
      const Fp8Blocks b = quantize_fp8_blocks(s.tensor);
      dequantize_fp8_blocks_into(b.q, b.scale_inv, dst);
    } else {
      dst.copy_(s.tensor);
    }
  }
}

}  // namespace slimpi
