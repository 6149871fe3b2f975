// Multi-token prediction in the model (model.mtp_num_layers): the trunk draws the same
// numbers with or without MTP depths; a depth's packed forward equals its forward
// through the paged KV cache a chunk at a time (any slots); its gradient reaches the MTP
// layers alone; Hugging Face names in MiMo's and DeepSeek-V3's layouts load into the
// same weights (DeepSeek's input projection halves swapped, its shared-head copies
// ignored), and files without MTP tensors leave fresh ones.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <slimpi/error.h>

#include <filesystem>
#include <map>

#include "arch/mtp_names.h"
#include "io/safetensors.h"
#include "io/tensor_io.h"
#include "model/attention.h"
#include "model/transformer.h"

namespace slimpi {
namespace {

ModelConfig mtp_config(int64_t depths) {
  ModelConfig c;
  c.vocab_size = 50;
  c.hidden_size = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.intermediate_size = 48;
  c.max_seq_len = 64;
  c.qkv_bias = true;
  c.init_std = 0.2;
  c.mtp_num_layers = depths;
  return c;
}

at::Tensor random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return at::randint(vocab, {n}, g, at::kLong);
}

TEST(Mtp, TheTrunkIsTheSameWithOrWithoutMtpDepths) {
  Transformer plain(mtp_config(0), 3, at::kCPU), with(mtp_config(2), 3, at::kCPU);
  EXPECT_EQ(with.n_mtp_layers(), 2);
  EXPECT_EQ(with.n_params(), mtp_config(2).n_params());
  EXPECT_EQ(with.n_params() - plain.n_params(), 2 * mtp_config(2).n_mtp_params_per_layer());
  std::map<std::string, at::Tensor> mine;
  for (const auto& p : with.parameters()) mine[p.name] = p.tensor;
  for (const auto& p : plain.parameters()) EXPECT_TRUE(at::equal(mine.at(p.name), p.tensor)) << p.name;
  EXPECT_TRUE(mine.count("model.mtp_layers.1.input_proj.weight"));
  EXPECT_EQ(mine.at("model.mtp_layers.0.input_proj.weight").sizes(), (std::vector<int64_t>{32, 64}));
}

TEST(Mtp, PackedDepthEqualsItsCachedForwardChunkByChunk) {
  Transformer m(mtp_config(2), 5, at::kCPU);
  at::NoGradGuard no_grad;
  const at::Tensor tokens = random_tokens(12, 50, 2);
  const at::Tensor hidden = m.forward_packed_hidden(tokens, {12});                 // [12, d]
  const at::Tensor next = at::cat({tokens.narrow(0, 1, 11), at::zeros({1}, at::kLong)});
  const at::Tensor h0 = m.forward_mtp_packed(0, hidden, next, {12});               // [12, d]
  const at::Tensor h1 = m.forward_mtp_packed(1, h0, next, {12});                   // depth 1 reads depth 0's output
  // The same entries through the cache in chunks 5 + 1 + 6, at slots in another order.
  KvCache cache = KvCache::allocate(m.config(), 32, at::kFloat, 1, /*mtp_layers=*/2);
  ASSERT_EQ(cache.k.size(), 4u);
  std::vector<int64_t> slots;
  for (int64_t i = 0; i < 12; ++i) slots.push_back(31 - 2 * i);
  const at::Tensor all_slots = at::tensor(slots, at::kLong);
  std::vector<at::Tensor> out0, out1;
  int64_t done = 0;
  for (int64_t n : {5, 1, 6}) {
    const std::vector<CachedSequence> seq{{done, n, all_slots.narrow(0, 0, done + n)}};
    const at::Tensor a = m.forward_mtp_incremental(0, hidden.narrow(0, done, n), next.narrow(0, done, n), seq, cache);
    out0.push_back(a);
    out1.push_back(m.forward_mtp_incremental(1, a, next.narrow(0, done, n), seq, cache));
    done += n;
  }
  EXPECT_TRUE(at::allclose(at::cat(out0), h0, 1e-5, 1e-5)) << (at::cat(out0) - h0).abs().max();
  EXPECT_TRUE(at::allclose(at::cat(out1), h1, 1e-5, 1e-5)) << (at::cat(out1) - h1).abs().max();
  EXPECT_EQ(m.head_logits(h0).sizes(), (std::vector<int64_t>{12, 50}));
  // A cache without the MTP layers is refused.
  KvCache plain = KvCache::allocate(m.config(), 32, at::kFloat);
  EXPECT_THROW(m.forward_mtp_incremental(0, hidden.narrow(0, 0, 1), next.narrow(0, 0, 1),
                                         {{0, 1, all_slots.narrow(0, 0, 1)}}, plain),
               Error);
}

TEST(Mtp, AnMtpLossGradientReachesTheMtpLayersAlone) {
  Transformer m(mtp_config(1), 5, at::kCPU);
  const at::Tensor tokens = random_tokens(10, 50, 3);
  const at::Tensor hidden = m.forward_packed_hidden(tokens, {10});
  const at::Tensor next = at::cat({tokens.narrow(0, 1, 9), at::zeros({1}, at::kLong)});
  const at::Tensor h = m.forward_mtp_packed(0, hidden.detach(), next, {10});
  m.head_logits(h).logsumexp(1).sum().backward();
  for (const auto& p : m.parameters()) {
    const bool mtp = p.name.rfind("model.mtp_layers.", 0) == 0;
    const bool touched = p.tensor.grad().defined() && p.tensor.grad().abs().sum().item<double>() > 0;
    EXPECT_EQ(touched, mtp) << p.name;
  }
}

class MtpNames : public ::testing::Test {
 protected:
  std::filesystem::path dir_;
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("slimpi_mtp_" + std::to_string(::getpid()) + "_" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
};

TEST_F(MtpNames, MiMoAndDeepSeekLayoutsLoadTheSameWeights) {
  const ModelConfig cfg = mtp_config(2);
  Transformer source(cfg, 11, at::kCPU);
  // MiMo: slimpi's own names.
  write_safetensors((dir_ / "mimo.safetensors").string(), source.parameters());
  // DeepSeek-V3: depth i as "model.layers.<L + i>.", renamed tails, the input projection's
  // column halves swapped, and each depth's copies of the shared embedding and head.
  std::vector<NamedTensor> deepseek;
  for (const auto& p : source.parameters()) {
    if (!is_mtp_parameter(p.name)) {
      deepseek.push_back(p);
      continue;
    }
    at::Tensor t = is_mtp_input_proj(p.name) ? swap_input_proj_halves(p.tensor.detach()) : p.tensor.detach();
    deepseek.push_back({deepseek_mtp_name(p.name, cfg.n_layers), t});
  }
  for (int64_t i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(cfg.n_layers + i) + ".";
    deepseek.push_back({p + "embed_tokens.weight", source.parameter("model.embed_tokens.weight").detach()});
    deepseek.push_back({p + "shared_head.head.weight", source.parameter("lm_head.weight").detach()});
  }
  write_safetensors((dir_ / "deepseek.safetensors").string(), deepseek);
  EXPECT_EQ(deepseek_mtp_name("model.mtp_layers.1.input_proj.weight", 2), "model.layers.3.eh_proj.weight");
  EXPECT_EQ(deepseek_mtp_name("model.mtp_layers.0.token_layernorm.weight", 2), "model.layers.2.enorm.weight");
  EXPECT_EQ(deepseek_mtp_name("model.mtp_layers.0.hidden_layernorm.weight", 2), "model.layers.2.hnorm.weight");
  EXPECT_EQ(deepseek_mtp_name("model.mtp_layers.0.final_layernorm.weight", 2), "model.layers.2.shared_head.norm.weight");
  EXPECT_EQ(deepseek_mtp_name("model.mtp_layers.0.self_attn.q_proj.weight", 2), "model.layers.2.self_attn.q_proj.weight");
  for (const char* file : {"mimo.safetensors", "deepseek.safetensors"}) {
    Transformer loaded(cfg, 99, at::kCPU);
    load_model_weights(loaded.parameters(), (dir_ / file).string());
    for (const auto& p : source.parameters())
      EXPECT_TRUE(at::equal(loaded.parameter(p.name), p.tensor)) << file << ": " << p.name;
  }
}

TEST_F(MtpNames, FilesWithoutMtpTensorsLeaveFreshOnesAndPartialOnesAreErrors) {
  Transformer trunk_only(mtp_config(0), 11, at::kCPU);
  write_safetensors((dir_ / "trunk.safetensors").string(), trunk_only.parameters());
  Transformer with(mtp_config(1), 12, at::kCPU), fresh(mtp_config(1), 12, at::kCPU);
  load_model_weights(with.parameters(), (dir_ / "trunk.safetensors").string());
  for (const auto& p : with.parameters()) {
    const at::Tensor& want = is_mtp_parameter(p.name) ? fresh.parameter(p.name) : trunk_only.parameter(p.name);
    EXPECT_TRUE(at::equal(p.tensor, want)) << p.name;
  }
  // Some MTP tensors but not all: the missing ones are named.
  std::vector<NamedTensor> partial = with.parameters();
  partial.erase(std::remove_if(partial.begin(), partial.end(),
                               [](const NamedTensor& t) { return t.name.find("mtp_layers.0.input_proj") != std::string::npos; }),
                partial.end());
  write_safetensors((dir_ / "partial.safetensors").string(), partial);
  try {
    load_model_weights(with.parameters(), (dir_ / "partial.safetensors").string());
    FAIL() << "a partial MTP stack loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.mtp_layers.0.input_proj.weight"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace slimpi
