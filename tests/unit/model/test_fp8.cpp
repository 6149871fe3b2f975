// Block-wise FP8 weights (model/fp8_blocks.h, sync/fp8_weights.h): the quantiser
// against a reference written here (every e4m3 code decoded from its bits, the nearest
// chosen by search), the scale grid's layout with partial blocks, the round trip's
// error bound, the fp8 image's layout and bytes, and a Hugging Face FP8 checkpoint
// (tests/fixtures/hf/qwen3_fp8, made by make_fixtures.py with slime's formula):
// loaded de-quantised (logits: transformers' FP8 loader's, in test_hf_models.cpp),
// then re-quantised, it gives back the file's e4m3 bytes.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "io/safetensors.h"
#include "io/tensor_io.h"
#include "model/fp8_blocks.h"
#include "model/transformer.h"
#include "sync/fp8_weights.h"

namespace slimpi {
namespace {

namespace fs = std::filesystem;

// e4m3fn (OCP FP8): sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
// subnormal (m / 8 * 2^-6); 0x7F / 0xFF are NaN; no infinities. Largest finite 448.
double decode_e4m3(uint8_t code) {
  const int sign = code >> 7, exponent = (code >> 3) & 0xF, mantissa = code & 0x7;
  if ((code & 0x7F) == 0x7F) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = exponent == 0 ? mantissa / 8.0 * std::ldexp(1.0, -6)
                                         : (1.0 + mantissa / 8.0) * std::ldexp(1.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

// The e4m3 code nearest to x (|x| <= 448), ties to the even mantissa: a search over all codes.
uint8_t nearest_e4m3(double x) {
  int best = -1;
  double best_gap = 0;
  for (int c = 0; c < 256; ++c) {
    const double v = decode_e4m3(uint8_t(c));
    if (std::isnan(v) || (v == 0 && std::signbit(v) != std::signbit(x))) continue;
    const double gap = std::abs(v - x);
    if (best < 0 || gap < best_gap || (gap == best_gap && (c & 1) == 0)) {
      best = c;
      best_gap = gap;
    }
  }
  return uint8_t(best);
}

TEST(Fp8Blocks, QuantiserMatchesAReferenceWrittenHere) {
  // 300 x 200: a 3 x 2 grid of blocks, the last row and column partial; each block its own scale.
  at::manual_seed(7);
  at::Tensor w = at::randn({300, 200});
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j)
      w.narrow(0, i * 128, std::min<int64_t>(128, 300 - i * 128)).narrow(1, j * 128, std::min<int64_t>(128, 200 - j * 128))
          .mul_(std::pow(10.0, i - j));
  w.narrow(0, 256, 44).narrow(1, 128, 72).zero_();  // an all-zero block
  const Fp8Blocks b = quantize_fp8_blocks(w);
  ASSERT_EQ(b.q.scalar_type(), at::kFloat8_e4m3fn);
  ASSERT_EQ(b.scale_inv.sizes().vec(), (std::vector<int64_t>{3, 2}));
  const at::Tensor wq = b.q.view(at::kByte);
  for (int64_t bi = 0; bi < 3; ++bi)
    for (int64_t bj = 0; bj < 2; ++bj) {
      const int64_t r0 = bi * 128, c0 = bj * 128, r1 = std::min<int64_t>(r0 + 128, 300), c1 = std::min<int64_t>(c0 + 128, 200);
      float amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::abs(w[r][c].item<float>()));
      const float s = std::max(amax, 1e-10f) / 448.0f, inv = 1.0f / s;
      EXPECT_EQ(b.scale_inv[bi][bj].item<float>(), s) << bi << "," << bj;
      for (int64_t r = r0; r < r1; r += 7)
        for (int64_t c = c0; c < c1; c += 3) {
          const float x = std::clamp(w[r][c].item<float>() * inv, -448.0f, 448.0f);
          ASSERT_EQ(wq[r][c].item<uint8_t>(), nearest_e4m3(x)) << "element " << r << "," << c << " x " << x;
        }
    }
  EXPECT_EQ(b.q.narrow(0, 256, 44).narrow(1, 128, 72).to(at::kFloat).abs().max().item<float>(), 0.0f);
}

TEST(Fp8Blocks, RoundTripErrorIsE4m3sAndRequantisingIsStable) {
  at::manual_seed(3);
  const at::Tensor w = at::randn({256, 384}) * 0.05;
  const Fp8Blocks b = quantize_fp8_blocks(w);
  const at::Tensor back = dequantize_fp8_blocks(b.q, b.scale_inv, at::kFloat);
  // Per element: within half an e4m3 step of its block, 2^-4 relative for normal values,
  // 2^-10 of the scale for subnormal ones (|x / s| < 2^-6).
  const at::Tensor s = b.scale_inv.repeat_interleave(128, 0).repeat_interleave(128, 1);
  const at::Tensor bound = at::maximum(w.abs() * std::ldexp(1.0, -4), s * std::ldexp(1.0, -10)) * 1.0001;
  EXPECT_TRUE((back - w).abs().le(bound).all().item<bool>());
  // The de-quantised weights quantise to the same bytes (what an FP8 checkpoint's masters do at the first sync).
  const Fp8Blocks again = quantize_fp8_blocks(back);
  EXPECT_TRUE(at::equal(again.q.view(at::kByte), b.q.view(at::kByte)));
  EXPECT_TRUE(at::allclose(again.scale_inv, b.scale_inv, 1e-6, 0));
  // bf16 engines hold the de-quantised weights rounded once.
  EXPECT_TRUE(at::equal(dequantize_fp8_blocks(b.q, b.scale_inv, at::kBFloat16), back.to(at::kBFloat16)));
}

TEST(Fp8Blocks, WhichTensorsAndScaleNames) {
  EXPECT_TRUE(is_fp8_weight("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(is_fp8_weight("model.layers.3.mlp.experts.7.down_proj.weight"));
  EXPECT_TRUE(is_fp8_weight("model.mtp_layers.0.input_proj.weight"));
  // Latent attention's projections, as DeepSeek-V3's FP8 checkpoints hold them.
  for (const char* p : {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"})
    EXPECT_TRUE(is_fp8_weight(std::string("model.layers.1.self_attn.") + p + ".weight")) << p;
  EXPECT_FALSE(is_fp8_weight("model.layers.1.self_attn.kv_a_layernorm.weight"));
  EXPECT_TRUE(is_fp8_weight("model.layers.1.mlp.shared_experts.down_proj.weight"));
  EXPECT_FALSE(is_fp8_weight("model.layers.1.mlp.gate.e_score_correction_bias"));
  EXPECT_FALSE(is_fp8_weight("model.layers.0.self_attn.q_proj.bias"));
  EXPECT_FALSE(is_fp8_weight("model.embed_tokens.weight"));
  EXPECT_FALSE(is_fp8_weight("lm_head.weight"));
  EXPECT_FALSE(is_fp8_weight("model.layers.0.mlp.gate.weight"));  // an MoE router
  EXPECT_FALSE(is_fp8_weight("model.layers.0.input_layernorm.weight"));
  EXPECT_EQ(fp8_scale_name("a.q_proj.weight"), "a.q_proj.weight_scale_inv");
  EXPECT_EQ(fp8_scale_shape(64, 129), (std::vector<int64_t>{1, 2}));
}

ModelConfig small_config() {
  ModelConfig c;
  c.vocab_size = 260;
  c.hidden_size = 160;  // two blocks, the second partial
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.intermediate_size = 96;
  c.max_seq_len = 32;
  return c;
}

// The sync's image: scales, then bf16 tensors, then e4m3 weights, back to back; its
// bytes de-quantised into a bf16 engine equal the round trip of every linear weight.
TEST(Fp8Image, LayoutBytesAndLoad) {
  const ModelConfig cfg = small_config();
  Transformer masters(cfg, 11, at::kCPU);
  const WeightImage image = fp8_weight_image(masters, true);
  int64_t fp8 = 0, bf16 = 0, scales = 0, seen_kind = 0;  // kinds in order: 0 scales, 1 bf16, 2 e4m3
  for (const auto& t : image.params) {
    const int kind = t.tensor.scalar_type() == at::kFloat ? 0 : t.tensor.scalar_type() == at::kBFloat16 ? 1 : 2;
    EXPECT_GE(kind, seen_kind) << t.name;
    seen_kind = kind;
    (kind == 0 ? scales : kind == 1 ? bf16 : fp8) += t.tensor.numel() * int64_t(t.tensor.element_size());
  }
  EXPECT_EQ(image.flat.numel(), fp8 + bf16 + scales);
  int64_t linear = 0, other = 0;
  for (const auto& p : masters.parameters()) (is_fp8_weight(p.name) ? linear : other) += p.tensor.numel();
  EXPECT_EQ(fp8, linear);
  EXPECT_EQ(bf16, 2 * other);
  // Per layer: q and o [160, 160] 2 x 2 blocks, k and v [80, 160] 1 x 2, gate and up [96, 160] 1 x 2, down [160, 96] 2 x 1.
  EXPECT_EQ(scales, 4 * 2 * (4 + 2 + 2 + 4 + 2 + 2 + 2));
  Transformer engine(cfg, 99, at::kCPU, at::kBFloat16);
  WeightImage received = fp8_weight_image(engine, false);
  received.flat.copy_(image.flat);  // what the sync's buckets do
  load_fp8_image(received, engine);
  Transformer direct(cfg, 98, at::kCPU, at::kBFloat16);
  copy_through_fp8(masters, direct);
  for (size_t i = 0; i < masters.parameters().size(); ++i) {
    const std::string& name = masters.parameters()[i].name;
    EXPECT_TRUE(at::equal(engine.parameters()[i].tensor, direct.parameters()[i].tensor)) << name;
    if (!is_fp8_weight(name))
      EXPECT_TRUE(at::equal(engine.parameters()[i].tensor, masters.parameters()[i].tensor.to(at::kBFloat16))) << name;
    else
      EXPECT_FALSE(at::equal(engine.parameters()[i].tensor, masters.parameters()[i].tensor.to(at::kBFloat16))) << name;
  }
}

// An FP8 checkpoint loads de-quantised into fp32 masters; quantising those again gives
// the file's e4m3 bytes (the rollout's weights are the checkpoint's) and its scales.
TEST(Fp8Checkpoint, MastersRequantiseToTheFilesBytes) {
  const fs::path dir = fs::path(SLIMPI_SOURCE_DIR) / "tests/fixtures/hf/qwen3_fp8";
  const fs::path deck_file = fs::temp_directory_path() / ("slimpi_fp8_" + std::to_string(::getpid()) + ".toml");
  std::ofstream(deck_file) << "[run]\nname = \"fp8\"\n";
  const Deck deck = load_deck(deck_file.string(), {"model.init_from=" + dir.string()});
  fs::remove(deck_file);
  Transformer m(ModelConfig::from_deck(deck), 1, at::kCPU);
  load_model_weights(m.parameters(), dir.string());
  std::map<std::string, at::Tensor> file;
  for (auto& t : read_safetensors((dir / "model.safetensors").string())) file[t.name] = t.tensor;
  int n_fp8 = 0;
  for (const auto& p : m.parameters()) {
    if (!is_fp8_weight(p.name)) continue;
    ++n_fp8;
    ASSERT_EQ(file.at(p.name).scalar_type(), at::kFloat8_e4m3fn) << p.name;
    const Fp8Blocks b = quantize_fp8_blocks(p.tensor);
    EXPECT_TRUE(at::equal(b.q.view(at::kByte), file.at(p.name).view(at::kByte))) << p.name;
    EXPECT_TRUE(at::allclose(b.scale_inv, file.at(fp8_scale_name(p.name)), 1e-6, 0)) << p.name;
  }
  EXPECT_EQ(n_fp8, 7);

  // A weight without its scales, or with scales of another grid: errors naming them.
  auto load_error = [&](const std::string& drop, const at::Tensor& replacement) {
    const fs::path bad = fs::temp_directory_path() / ("slimpi_fp8_bad_" + std::to_string(::getpid()) + ".safetensors");
    std::vector<NamedTensor> tensors;
    for (const auto& [name, t] : file)
      if (name != drop) tensors.push_back({name, t});
      else if (replacement.defined()) tensors.push_back({name, replacement});
    write_safetensors(bad.string(), tensors);
    std::string message;
    try {
      load_model_weights(m.parameters(), bad.string());
    } catch (const Error& e) {
      message = e.what();
    }
    fs::remove(bad);
    return message;
  };
  const std::string scales = "model.layers.0.mlp.down_proj.weight_scale_inv";
  EXPECT_NE(load_error(scales, {}).find("model.layers.0.mlp.down_proj.weight is F8_E4M3 but the files hold no " + scales),
            std::string::npos) << load_error(scales, {});
  EXPECT_NE(load_error(scales, at::ones({2, 2})).find(scales + " is Float 2x2; a 128x256 F8_E4M3 weight in 128 x 128 "
                                                      "blocks needs F32 1x2"),
            std::string::npos) << load_error(scales, at::ones({2, 2}));
}

}  // namespace
}  // namespace slimpi
