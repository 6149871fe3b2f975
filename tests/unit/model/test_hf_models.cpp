// Hugging Face models in: a model built from config.json alone (model.init_from) and
// loaded from its safetensors (fp32 / bf16, single / sharded) gives the logits
// transformers computed (golden fixtures, tests/fixtures/hf/make_fixtures.py); every
// silent-wrong case of the old loader is an error naming the problem.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <set>
#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "arch/architecture.h"
#include "arch/mtp_names.h"
#include "ckpt/hf_export.h"
#include "io/safetensors.h"
#include "io/tensor_io.h"
#include "model/transformer.h"

namespace slimpi {
namespace {

namespace fs = std::filesystem;
const fs::path kFixtures = fs::path(SLIMPI_SOURCE_DIR) / "tests/fixtures/hf";

class HfDir : public ::testing::Test {
 protected:
  fs::path tmp_;
  void SetUp() override {
    tmp_ = fs::temp_directory_path() / ("slimpi_hf_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
    std::ofstream(tmp_ / "deck.toml") << "[run]\nname = \"hf\"\n";
  }
  void TearDown() override { fs::remove_all(tmp_); }

  Deck deck_for(const fs::path& model_dir, std::vector<std::string> sets = {}) {
    sets.push_back("model.init_from=" + model_dir.string());
    return load_deck((tmp_ / "deck.toml").string(), sets);
  }
  // The message loading the deck throws, "" if it loads.
  std::string deck_error(const fs::path& model_dir, std::vector<std::string> sets = {}) {
    try {
      deck_for(model_dir, std::move(sets));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  // A copy of fixture `name` whose config.json `edit` changes.
  fs::path edited(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    const fs::path dir = tmp_ / name;
    fs::copy(kFixtures / name, dir, fs::copy_options::recursive);
    nlohmann::json c = nlohmann::json::parse(std::ifstream(dir / "config.json"));
    edit(c);
    std::ofstream(dir / "config.json") << c.dump(2);
    return dir;
  }
};

// The bar of a fixture: 2e-5 (fp32 round-off of logits of size ~10), or, for a fixture whose
// golden logits are an fp64 forward's (Qwen3.5, make_fixtures.py), twice the gap of
// transformers' own fp32 forward (fp32_logits_<i>) to them, if that is larger.
double golden_bar(const fs::path& dir) {
  std::map<std::string, at::Tensor> g;
  for (const auto& t : read_safetensors((dir / "golden.safetensors").string())) g[t.name] = t.tensor;
  double transformers_gap = 0;
  for (int i = 0; g.count("fp32_logits_" + std::to_string(i)); ++i)
    transformers_gap = std::max(transformers_gap, (g["fp32_logits_" + std::to_string(i)] - g["logits_" + std::to_string(i)])
                                                      .abs().max().item<double>());
  return std::max(2e-5, 2 * transformers_gap);
}

// The largest |logit difference| to transformers over the fixture's sequences, each
// alone and all packed together.
double golden_gap(const fs::path& dir, const Transformer& m) {
  at::NoGradGuard no_grad;
  const std::vector<NamedTensor> golden = read_safetensors((dir / "golden.safetensors").string());
  std::map<std::string, at::Tensor> g;
  for (const auto& t : golden) g[t.name] = t.tensor;
  double gap = 0;
  std::vector<at::Tensor> tokens, logits;
  std::vector<int64_t> lens;
  for (int i = 0; g.count("tokens_" + std::to_string(i)); ++i) {
    tokens.push_back(g["tokens_" + std::to_string(i)]);
    logits.push_back(g["logits_" + std::to_string(i)]);
    lens.push_back(tokens.back().size(0));
    gap = std::max(gap, (m.forward_packed(tokens.back(), {lens.back()}) - logits.back()).abs().max().item<double>());
  }
  EXPECT_GE(tokens.size(), 2u);
  gap = std::max(gap, (m.forward_packed(at::cat(tokens), lens) - at::cat(logits)).abs().max().item<double>());
  return gap;
}

class GoldenLogits : public HfDir, public ::testing::WithParamInterface<std::string> {};

TEST_P(GoldenLogits, ModelFromConfigJsonMatchesTransformers) {
  const fs::path dir = kFixtures / GetParam();
  const Deck deck = deck_for(dir);
  EXPECT_NE(deck.source("model.hidden_size").find("config.json (hidden_size)"), std::string::npos);
  const ModelConfig cfg = ModelConfig::from_deck(deck);
  Transformer m(cfg, 1, at::kCPU);
  load_model_weights(m.parameters(), dir.string(), "model", false, StoredWhole{&m.config(), {}});
  const double gap = golden_gap(dir, m), bar = golden_bar(dir);
  std::printf("%s: largest |logit - transformers'| %.3g (bar %.3g)\n", GetParam().c_str(), gap, bar);
  EXPECT_LT(gap, bar);  // measured 2.2e-6 to 6.7e-6 (fp32 round-off of logits of size ~10); Qwen3.5 below
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenLogits,
                         ::testing::Values("llama_gqa_untied", "llama3_rope_tied_bias_bf16_sharded",
                                           "qwen2_linear_rope_sharded", "qwen3_head_dim_bf16", "qwen3_tied",
                                           "qwen3_moe", "qwen3_moe_step2_bf16", "qwen2_moe_shared", "mixtral",
                                           "qwen3_fp8", "glm4_moe_grouped", "glm4_moe_plain_bf16", "deepseek_v3",
                                           "deepseek_v3_no_q_lora_bf16", "glm4_moe_lite", "deepseek_v3_yarn",
                                           "qwen3_yarn", "deepseek_v3_fp8", "glm4_moe_fp8",
                                           "deepseek_v3_linear_mscale", "qwen3_5", "qwen3_5_moe_bf16",
                                           "qwen3_next"));

// Qwen3-MoE, Qwen2-MoE, Mixtral and GLM-4.5 (DeepSeekMoE): every token's top-k experts in every
// sparse layer and the load-balancing loss (where transformers computes one) equal transformers'; replaying those experts gives the same logits, replaying
// other experts changes them, and the z-loss is the mean squared logsumexp.
class GoldenMoe : public HfDir, public ::testing::WithParamInterface<std::string> {};

TEST_P(GoldenMoe, RoutingAndLoadBalancingLossMatchTransformers) {
  at::NoGradGuard no_grad;
  const fs::path dir = kFixtures / GetParam();
  const ModelConfig cfg = ModelConfig::from_deck(deck_for(dir));
  ASSERT_GT(cfg.n_experts, 0);
  Transformer m(cfg, 1, at::kCPU);
  load_model_weights(m.parameters(), dir.string(), "model", false, StoredWhole{&m.config(), {}});
  std::map<std::string, at::Tensor> g;
  for (const auto& t : read_safetensors((dir / "golden.safetensors").string())) g[t.name] = t.tensor;
  for (int i = 0; g.count("tokens_" + std::to_string(i)); ++i) {
    const at::Tensor tokens = g["tokens_" + std::to_string(i)];
    const int64_t L = tokens.size(0);
    MoeTrace trace;
    const at::Tensor logits = m.forward_packed(tokens, {L}, &trace);
    const at::Tensor want = g["experts_" + std::to_string(i)];  // [L, sparse layers, k]
    ASSERT_EQ(trace.chosen.sizes(), want.sizes());
    // The same set of experts per token and layer (GLM-4.5's transformers router lists them unsorted).
    EXPECT_TRUE(at::equal(std::get<0>(trace.chosen.sort(-1)), std::get<0>(want.sort(-1)))) << "sequence " << i;
    if (g.count("aux_loss_" + std::to_string(i)))
      EXPECT_NEAR(moe_load_balancing_loss(trace.router_logits, cfg.n_experts_per_tok).item<double>(),
                  g["aux_loss_" + std::to_string(i)].item<double>(), 1e-5);
    at::Tensor lse = at::logsumexp(at::cat(trace.router_logits), -1);
    EXPECT_NEAR(moe_router_z_loss(trace.router_logits).item<double>(), lse.square().mean().item<double>(), 1e-9);

    MoeTrace replay;
    replay.replay = trace.chosen;
    EXPECT_TRUE(at::allclose(m.forward_packed(tokens, {L}, &replay), logits, 0, 1e-6));
    EXPECT_TRUE(at::equal(replay.chosen, trace.chosen));
    MoeTrace other;  // every token to the next experts: the routing is forced, the logits change
    other.replay = (trace.chosen + 1).remainder(cfg.n_experts);
    EXPECT_GT((m.forward_packed(tokens, {L}, &other) - logits).abs().max().item<double>(), 1e-3);
    EXPECT_TRUE(at::equal(other.chosen, other.replay));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenMoe,
                         ::testing::Values("qwen3_moe", "qwen3_moe_step2_bf16", "qwen2_moe_shared", "mixtral",
                                           "glm4_moe_grouped", "glm4_moe_plain_bf16", "deepseek_v3",
                                           "deepseek_v3_no_q_lora_bf16", "glm4_moe_lite", "deepseek_v3_fp8",
                                           "glm4_moe_fp8", "qwen3_5_moe_bf16", "qwen3_next"));

// GLM-4.5: config.json's DeepSeekMoE and attention fields as deck keys (the partial
// rotary factor in rope_parameters, or defaulted to 0.5 as transformers does); the export's
// config.json reads back as the same model; what the family cannot be is refused; a dense
// family with a partial rotary factor is refused.
TEST_F(HfDir, Glm4MoeConfigRoundTripsAndBadFieldsAreErrors) {
  const ModelConfig cfg = ModelConfig::from_deck(deck_for(kFixtures / "glm4_moe_grouped"));
  EXPECT_EQ(cfg.n_experts, 8);
  EXPECT_EQ(cfg.moe_router, "sigmoid");
  EXPECT_TRUE(cfg.moe_router_bias);
  EXPECT_EQ(cfg.moe_n_group, 4);
  EXPECT_EQ(cfg.moe_topk_group, 2);
  EXPECT_EQ(cfg.moe_routed_scaling_factor, 2.5);
  EXPECT_EQ(cfg.n_shared_experts, 1);
  EXPECT_EQ(cfg.first_k_dense_replace, 1);
  EXPECT_EQ(cfg.n_moe_layers(), 2);
  EXPECT_EQ(cfg.rotary_dim(), 4);
  EXPECT_TRUE(cfg.qk_norm && cfg.qkv_bias && !cfg.o_bias);
  EXPECT_EQ(export_architecture(cfg), &architectures().get("glm4_moe"));
  Transformer m(cfg, 1, at::kCPU);
  EXPECT_EQ(m.n_params(), cfg.n_params());
  const ModelConfig plain = ModelConfig::from_deck(deck_for(kFixtures / "glm4_moe_plain_bf16"));
  EXPECT_EQ(plain.partial_rotary_factor, 0.5);
  EXPECT_EQ(plain.rotary_dim(), 8);
  EXPECT_EQ(plain.n_shared_experts, 2);
  EXPECT_EQ(plain.n_moe_layers(), 2);
  EXPECT_FALSE(plain.qk_norm || plain.qkv_bias || plain.norm_topk_prob);

  // The exported config.json describes the same model.
  const fs::path exported = tmp_ / "glm_export";
  fs::create_directories(exported);
  std::ofstream(exported / "config.json") << hf_config_json(cfg);
  fs::copy_file(kFixtures / "glm4_moe_grouped" / "model.safetensors", exported / "model.safetensors");
  const ModelConfig back = ModelConfig::from_deck(deck_for(exported));
  EXPECT_EQ(Transformer(back, 1, at::kCPU).n_params(), m.n_params());
  EXPECT_TRUE(back.uses_deepseek_features());
  for (auto [a, b] : {std::pair{back.moe_n_group, cfg.moe_n_group}, {back.moe_topk_group, cfg.moe_topk_group},
                      {back.n_shared_experts, cfg.n_shared_experts}, {back.first_k_dense_replace, cfg.first_k_dense_replace},
                      {back.rotary_dim(), cfg.rotary_dim()}, {back.n_moe_layers(), cfg.n_moe_layers()}})
    EXPECT_EQ(a, b);
  EXPECT_EQ(back.moe_routed_scaling_factor, cfg.moe_routed_scaling_factor);

  auto error_of = [&](const std::function<void(nlohmann::json&)>& edit) {  // loading the deck, then its [model]
    const fs::path dir = edited("glm4_moe_grouped", edit);
    std::string e = deck_error(dir);
    if (e.empty()) try {
        ModelConfig::from_deck(deck_for(dir));
      } catch (const Error& err) {
        e = err.what();
      }
    fs::remove_all(dir);
    return e;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {error_of([](auto& c) { c["n_group"] = 3; }), "glm4_moe_grouped/config.json (n_group)) = 3 must divide model.n_experts = 8"},
      {error_of([](auto& c) { c["topk_group"] = 5; }), "model.moe_topk_group"},
      {error_of([](auto& c) { c["scoring_func"] = "softmax"; }), "scoring_func 'softmax' is not supported (sigmoid)"},
      {error_of([](auto& c) { c["rope_parameters"]["partial_rotary_factor"] = 1.5; }),
       "'rope_parameters.partial_rotary_factor' = 1.5 must be in (0, 1]"},
      {error_of([](auto& c) { c["num_experts_per_tok"] = 5; }), "exceeds the 4 experts of the model.moe_topk_group = 2"},
  };
  for (const auto& [message, want] : cases) EXPECT_NE(message.find(want), std::string::npos) << message;
  // A field config.json leaves out takes its family's transformers default (DeepSeek-V3's
  // routed_scaling_factor 2.5, not GLM-4.5's 1.0); a deck that gives a plain family
  // DeepSeekMoE's routing contradicts its config.
  const fs::path bare = edited("deepseek_v3", [](nlohmann::json& c) { c.erase("routed_scaling_factor"); });
  EXPECT_EQ(ModelConfig::from_deck(deck_for(bare)).moe_routed_scaling_factor, 2.5);
  const std::string routed = deck_error(kFixtures / "qwen3_moe", {"model.moe_router=sigmoid"});
  EXPECT_NE(routed.find("model.moe_router = \"sigmoid\" (--set) contradicts"), std::string::npos) << routed;
  const std::string dense = deck_error(
      edited("llama_gqa_untied", [](nlohmann::json& c) { c["rope_parameters"]["partial_rotary_factor"] = 0.5; }));
  EXPECT_NE(dense.find("partial_rotary_factor != 1 is not supported for this architecture"), std::string::npos) << dense;
}

// GLM-4.5's next-token-prediction layer as released checkpoints store it
// (model.layers.<L>.{enorm, hnorm, eh_proj, shared_head.norm} and an MoE decoder layer,
// with copies of the embedding and head): it loads as slimpi's MTP depth, an MoE layer;
// the trunk is unchanged; the export's DeepSeek-V3 names hold the same tensors.
TEST_F(HfDir, Glm4NextnLayerLoadsAsAnMoeMtpDepth) {
  const fs::path dir = kFixtures / "glm4_moe_nextn";
  const ModelConfig cfg = ModelConfig::from_deck(deck_for(dir));
  EXPECT_EQ(cfg.mtp_num_layers, 1);
  EXPECT_TRUE(cfg.mtp_is_moe());
  Transformer m(cfg, 1, at::kCPU);
  EXPECT_EQ(m.n_params(), cfg.n_params());
  load_model_weights(m.parameters(), dir.string());
  EXPECT_LT(golden_gap(dir, m), 2e-5);  // glm4_moe_grouped's trunk and logits
  std::map<std::string, at::Tensor> file;
  for (auto& t : read_safetensors((dir / "model.safetensors").string())) file[t.name] = t.tensor;
  int64_t matched = 0;
  for (const auto& p : m.parameters()) {
    if (!is_mtp_parameter(p.name)) continue;
    const std::string theirs = deepseek_mtp_name(p.name, cfg.n_layers);
    ASSERT_TRUE(file.count(theirs)) << p.name << " -> " << theirs;
    const at::Tensor want = is_mtp_input_proj(p.name) ? swap_input_proj_halves(file[theirs]) : file[theirs];
    EXPECT_TRUE(at::equal(p.tensor, want)) << p.name;
    ++matched;
  }
  EXPECT_EQ(matched, 4 + 11 + 2 + 3 * 8 + 3);  // norms and projection; attention; router and bias; experts; shared
  EXPECT_EQ(deepseek_mtp_name("model.mtp_layers.0.mlp.gate.e_score_correction_bias", 3),
            "model.layers.3.mlp.gate.e_score_correction_bias");
  at::NoGradGuard no_grad;
  const at::Tensor tokens = at::arange(1, 12, at::kLong);
  const at::Tensor hidden = m.forward_packed_hidden(tokens, {11});
  const at::Tensor out = m.forward_mtp_packed(0, hidden, tokens.roll(-1), {11});  // [11, d]
  EXPECT_EQ(out.sizes(), hidden.sizes());
  EXPECT_TRUE(at::isfinite(out).all().item<bool>());
}

// Qwen3.5's and Qwen3-Next's MTP depth: config.json's mtp_num_hidden_layers, tensors
// "mtp.*" (arch/mtp_names.h: one input projection "fc" over [embedding ; hidden], the
// norms, the layer "mtp.layers.0.*": gated full attention, an MoE layer in the MoE models).
// A fixture with an MTP depth's tensors added loads them into slimpi's depth, its trunk
// unchanged, or, with model.mtp_num_layers = 0, skipped; of two depths the first is read;
// a depth with its own embedding is refused.
TEST_F(HfDir, Qwen3_5MtpDepthLoadsFromItsMtpTensors) {
  EXPECT_EQ(qwen_mtp_name("model.mtp_layers.0.input_proj.weight"), "mtp.fc.weight");
  EXPECT_EQ(qwen_mtp_name("model.mtp_layers.0.token_layernorm.weight"), "mtp.pre_fc_norm_embedding.weight");
  EXPECT_EQ(qwen_mtp_name("model.mtp_layers.0.hidden_layernorm.weight"), "mtp.pre_fc_norm_hidden.weight");
  EXPECT_EQ(qwen_mtp_name("model.mtp_layers.0.final_layernorm.weight"), "mtp.norm.weight");
  EXPECT_EQ(qwen_mtp_name("model.mtp_layers.0.self_attn.q_proj.weight"), "mtp.layers.0.self_attn.q_proj.weight");
  EXPECT_THROW(qwen_mtp_name("model.mtp_layers.1.input_proj.weight"), Error);
  for (const std::string name : {"qwen3_5", "qwen3_5_moe_bf16", "qwen3_next"}) {
    const bool nested = name != "qwen3_next";
    const fs::path dir = edited(name, [&](nlohmann::json& c) { (nested ? c["text_config"] : c)["mtp_num_hidden_layers"] = 1; });
    const ModelConfig cfg = ModelConfig::from_deck(deck_for(dir));
    ASSERT_EQ(cfg.mtp_num_layers, 1) << name;
    // (an MoE layer where every layer is: Qwen3.5-MoE's; the qwen3_next fixture's
    // decoder_sparse_step 2 leaves layer 0, whose MLP the depth's follows, dense)
    EXPECT_EQ(cfg.mtp_is_moe(), name == "qwen3_5_moe_bf16") << name;
    // The files' MTP tensors: a seeded slimpi model's depth, in Qwen3.5's names and layout.
    Transformer source(cfg, 5, at::kCPU);
    std::vector<NamedTensor> files = read_safetensors((dir / "model.safetensors").string());
    int64_t n_mtp = 0;
    for (const auto& p : source.parameters())
      if (is_mtp_parameter(p.name)) {
        const at::Tensor t = p.tensor.detach();
        files.push_back({qwen_mtp_name(p.name), is_mtp_input_proj(p.name) ? swap_input_proj_halves(t) : t});
        ++n_mtp;
      }
    // norms and projection; the attention and its norms; router, experts, shared expert and its gate, or the MLP
    EXPECT_EQ(n_mtp, 4 + 8 + (cfg.mtp_is_moe() ? 1 + 3 * cfg.n_experts + 3 + 1 : 3)) << name;
    write_safetensors((dir / "model.safetensors").string(), files);
    Transformer m(cfg, 1, at::kCPU);
    load_model_weights(m.parameters(), dir.string(), "model", false, StoredWhole{&m.config(), {}});
    for (const auto& p : m.parameters())
      if (is_mtp_parameter(p.name)) EXPECT_TRUE(at::equal(p.tensor, source.parameter(p.name))) << name << ": " << p.name;
    EXPECT_LT(golden_gap(dir, m), golden_bar(dir)) << name;  // the trunk as it was
    // A deck's model.mtp_num_layers = 0 leaves the files' depth out (a critic's or a
    // teacher's trunk too): its tensors are skipped, not unused.
    const ModelConfig without = ModelConfig::from_deck(deck_for(dir, {"model.mtp_num_layers=0"}));
    EXPECT_EQ(without.mtp_num_layers, 0) << name;
    Transformer trunk(without, 1, at::kCPU);
    EXPECT_NO_THROW(load_model_weights(trunk.parameters(), dir.string(), "model", false,
                                       StoredWhole{&trunk.config(), {}}))
        << name;
    EXPECT_LT(golden_gap(dir, trunk), golden_bar(dir)) << name;
  }
  // Two depths in the files: slimpi reads the first (the depths share mtp.fc and the norms);
  // the second's layer is not read.
  fs::remove_all(tmp_ / "qwen3_5");
  const fs::path two = edited("qwen3_5", [](auto& c) { c["text_config"]["mtp_num_hidden_layers"] = 2; });
  const Deck two_deck = deck_for(two);
  const ModelConfig one = ModelConfig::from_deck(two_deck);
  EXPECT_EQ(one.mtp_num_layers, 1);
  EXPECT_NE(two_deck.source("model.mtp_num_layers").find("mtp_num_hidden_layers = 2: the first"), std::string::npos)
      << two_deck.source("model.mtp_num_layers");
  {
    Transformer source(one, 5, at::kCPU);
    std::vector<NamedTensor> files = read_safetensors((two / "model.safetensors").string());
    for (const auto& p : source.parameters())
      if (is_mtp_parameter(p.name)) {
        const at::Tensor t = p.tensor.detach();
        files.push_back({qwen_mtp_name(p.name), is_mtp_input_proj(p.name) ? swap_input_proj_halves(t) : t});
        if (p.name.find(".mtp_layers.0.self_attn.") != std::string::npos)  // a second depth's layer
          files.push_back({"mtp.layers.1." + p.name.substr(std::string("model.mtp_layers.0.").size()), t});
      }
    write_safetensors((two / "model.safetensors").string(), files);
    Transformer m(one, 1, at::kCPU);
    EXPECT_NO_THROW(load_model_weights(m.parameters(), two.string(), "model", false, StoredWhole{&m.config(), {}}));
    EXPECT_TRUE(at::equal(m.parameter("model.mtp_layers.0.input_proj.weight"),
                          source.parameter("model.mtp_layers.0.input_proj.weight")));
  }
  fs::remove_all(tmp_ / "qwen3_5");
  EXPECT_NE(deck_error(edited("qwen3_5", [](auto& c) { c["text_config"]["mtp_use_dedicated_embeddings"] = true; }))
                .find("'mtp_use_dedicated_embeddings' = true"),
            std::string::npos);
}

// Mixtral: its config reads as every layer sparse with the expert width in
// intermediate_size; its tensor names (block_sparse_moe.*, w1 / w3 / w2) map to slimpi's;
// a sliding window that could act and router jitter are refused.
// Qwen3.5's config: what its families cannot be is refused, naming the field.
TEST_F(HfDir, Qwen3_5ConfigsThatAreNotItAreErrors) {
  auto error_of = [&](const std::function<void(nlohmann::json&)>& edit) {
    fs::remove_all(tmp_ / "qwen3_5");  // (each case its own copy)
    return deck_error(edited("qwen3_5", edit));
  };
  EXPECT_NE(error_of([](auto& c) { c["text_config"]["layer_types"] = {"linear_attention", "full_attention"}; })
                .find("layer_types has 2 entries for num_hidden_layers = 4"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& c) {
              c["text_config"]["layer_types"] = {"full_attention", "full_attention", "full_attention", "full_attention"};
            }).find("is not supported"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& c) {
              c["text_config"]["layer_types"] = {"linear_attention", "full_attention", "linear_attention",
                                                 "linear_attention"};
            }).find("is not supported"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& c) { c.erase("text_config"); }).find("keeps its text model's fields in 'text_config'"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& c) { c["text_config"].erase("linear_num_value_heads"); }).find("linear_num_value_heads"),
            std::string::npos);
  // The gate and the zero-centred norms belong to hybrid models only (a deck cannot give them to another).
  try {
    ModelConfig::from_deck(load_deck((tmp_ / "deck.toml").string(), {"model.attn_output_gate=true"}));
    ADD_FAILURE() << "a gated attention without Gated DeltaNet layers";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.full_attention_interval > 1"), std::string::npos) << e.what();
  }
}

TEST_F(HfDir, MixtralConfigAndNames) {
  const ModelConfig cfg = ModelConfig::from_deck(deck_for(kFixtures / "mixtral"));
  EXPECT_EQ(cfg.n_experts, 4);
  EXPECT_EQ(cfg.moe_intermediate_size, 24);
  EXPECT_EQ(cfg.moe_layer_freq, 1);
  EXPECT_TRUE(cfg.norm_topk_prob);
  EXPECT_FALSE(cfg.qk_norm);
  const auto mixtral_name = architectures().get("mixtral").tensor_name;
  EXPECT_EQ(mixtral_name("model.layers.3.mlp.gate.weight"), "model.layers.3.block_sparse_moe.gate.weight");
  EXPECT_EQ(mixtral_name("model.layers.0.mlp.experts.7.gate_proj.weight"),
            "model.layers.0.block_sparse_moe.experts.7.w1.weight");
  EXPECT_EQ(mixtral_name("model.layers.0.mlp.experts.7.up_proj.weight"),
            "model.layers.0.block_sparse_moe.experts.7.w3.weight");
  EXPECT_EQ(mixtral_name("model.layers.0.mlp.experts.7.down_proj.weight"),
            "model.layers.0.block_sparse_moe.experts.7.w2.weight");
  EXPECT_EQ(mixtral_name("model.layers.0.mlp.down_proj.weight"), "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(mixtral_name("model.layers.0.mlp.shared_expert.up_proj.weight"),
            "model.layers.0.mlp.shared_expert.up_proj.weight");
  EXPECT_EQ(mixtral_name("lm_head.weight"), "lm_head.weight");
  EXPECT_EQ(export_architecture(cfg), &architectures().get("mixtral"));
  const std::string window = deck_error(edited("mixtral", [](nlohmann::json& c) { c["sliding_window"] = 64; }));
  EXPECT_NE(window.find("sliding_window = 64 is not supported"), std::string::npos) << window;
  fs::remove_all(tmp_ / "mixtral");
  EXPECT_EQ(deck_error(edited("mixtral", [](nlohmann::json& c) { c["sliding_window"] = 4096; })), "");  // >= 128: no effect
  fs::remove_all(tmp_ / "mixtral");
  const std::string jitter = deck_error(edited("mixtral", [](nlohmann::json& c) { c["router_jitter_noise"] = 0.1; }));
  EXPECT_NE(jitter.find("router_jitter_noise"), std::string::npos) << jitter;
  fs::remove_all(tmp_ / "mixtral");
  // A tensor missing from Mixtral-named files is reported under the files' naming.
  const fs::path dir = tmp_ / "mixtral_missing";
  fs::create_directories(dir);
  fs::copy_file(kFixtures / "mixtral" / "config.json", dir / "config.json");
  std::vector<NamedTensor> kept;
  for (auto& t : read_safetensors((kFixtures / "mixtral" / "model.safetensors").string()))
    if (t.name != "model.layers.1.block_sparse_moe.experts.3.w2.weight") kept.push_back(t);
  write_safetensors((dir / "model.safetensors").string(), kept, {{"format", "pt"}});
  Transformer m(cfg, 1, at::kCPU);
  try {
    load_model_weights(m.parameters(), dir.string());
    ADD_FAILURE() << "loaded with a tensor missing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the files lack: model.layers.1.block_sparse_moe.experts.3.w2.weight"),
              std::string::npos) << e.what();
  }
}

// fp16 checkpoints convert on load like bf16 ones: the fp32 fixture's tensors stored as
// F16 give its golden logits to fp16 rounding.
TEST_F(HfDir, Fp16WeightsConvertOnLoad) {
  const fs::path src = kFixtures / "llama_gqa_untied", dir = tmp_ / "fp16";
  fs::create_directories(dir);
  fs::copy_file(src / "config.json", dir / "config.json");
  fs::copy_file(src / "golden.safetensors", dir / "golden.safetensors");
  std::vector<NamedTensor> half = read_safetensors((src / "model.safetensors").string());
  for (auto& t : half) t.tensor = t.tensor.to(at::kHalf);
  write_safetensors((dir / "model.safetensors").string(), half);
  Transformer m(ModelConfig::from_deck(deck_for(dir)), 1, at::kCPU);
  load_model_weights(m.parameters(), dir.string());
  const double gap = golden_gap(dir, m);
  EXPECT_GT(gap, 1e-6);  // the weights really went through fp16
  EXPECT_LT(gap, 5e-2);
}

// Hub checkpoints written by transformers 4 keep rope_theta and rope_scaling at the top
// level ("type" or "rope_type"); transformers 5 writes rope_parameters. Both read alike.
TEST_F(HfDir, TopLevelRopeScalingAsTransformers4WritesIt) {
  const fs::path dir = edited("qwen2_linear_rope_sharded", [](nlohmann::json& c) {
    c["rope_theta"] = c["rope_parameters"]["rope_theta"];
    c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
    c.erase("rope_parameters");
  });
  const ModelConfig cfg = ModelConfig::from_deck(deck_for(dir));
  EXPECT_EQ(cfg.rope_scaling, "linear");
  EXPECT_EQ(cfg.rope_theta, 1e6);
  Transformer m(cfg, 1, at::kCPU);
  load_model_weights(m.parameters(), dir.string());
  EXPECT_LT(golden_gap(dir, m), 1e-4);
}

// YaRN's pretraining length where configs put it, as transformers' standardize_rope_params
// reads it: a top-level original_max_position_embeddings wins over the scaling object's
// (the same logits when it says the same); yarn without a factor takes
// max_position_embeddings over that length (DeepSeek's configs allow it).
TEST_F(HfDir, YarnLengthAndFactorWhereConfigsPutThem) {
  const fs::path top = edited("deepseek_v3_yarn", [](nlohmann::json& c) {
    c["original_max_position_embeddings"] = c["rope_parameters"]["original_max_position_embeddings"];
    c["rope_parameters"]["original_max_position_embeddings"] = 1000;  // overridden by the top level
    c["rope_parameters"].erase("factor");  // 128 / 32 = 4, the fixture's factor
  });
  const Deck deck = deck_for(top);
  const ModelConfig cfg = ModelConfig::from_deck(deck);
  EXPECT_EQ(cfg.rope_original_max_seq_len, 32);
  EXPECT_EQ(cfg.rope_factor, 4.0);
  EXPECT_EQ(deck.source("model.rope_original_max_seq_len").find("config.json (original_max_position_embeddings)") !=
                std::string::npos,
            true)
      << deck.source("model.rope_original_max_seq_len");
  Transformer m(cfg, 1, at::kCPU);
  load_model_weights(m.parameters(), top.string());
  EXPECT_LT(golden_gap(top, m), 2e-5);
  // No length anywhere but max_position_embeddings: that is the pretraining length.
  const fs::path bare = edited("qwen3_yarn", [](nlohmann::json& c) {
    c["rope_parameters"].erase("original_max_position_embeddings");
  });
  EXPECT_EQ(ModelConfig::from_deck(deck_for(bare)).rope_original_max_seq_len, 128);
}

TEST_F(HfDir, DeckKeysThatContradictTheConfigAreErrors) {
  const fs::path dir = kFixtures / "llama_gqa_untied";
  EXPECT_NE(deck_error(dir, {"model.n_heads=8"})
                .find("model.n_heads = 8 (--set) contradicts num_attention_heads = 4 in"),
            std::string::npos);
  EXPECT_NE(deck_error(dir, {"model.tie_word_embeddings=true"}).find("contradicts tie_word_embeddings = false"),
            std::string::npos);
  EXPECT_NE(deck_error(dir, {"model.rope_theta=500000"}).find("contradicts rope_parameters.rope_theta"),
            std::string::npos);
  EXPECT_NE(deck_error(dir, {"model.qkv_bias=true"}).find("contradicts attention_bias = false"), std::string::npos);
  EXPECT_NE(deck_error(dir, {"model.max_seq_len=4096"}).find("contradicts max_position_embeddings = 128"),
            std::string::npos);
  // Agreeing keys, and a lower max_seq_len (a limit, not a shape), are fine.
  EXPECT_EQ(deck_error(dir, {"model.n_heads=4", "model.max_seq_len=64", "model.n_kv_heads=2"}), "");
  EXPECT_EQ(deck_for(dir, {"model.max_seq_len=64"}).get_int("model.max_seq_len"), 64);
}

TEST_F(HfDir, ConfigFieldsThatChangeTheMathAndAreNotSupportedAreErrors) {
  auto error_of = [&](const std::string& tag, const std::function<void(nlohmann::json&)>& edit) {
    return deck_error(edited("llama_gqa_untied", [&](nlohmann::json& c) {
      edit(c);
      c["slimpi_test_tag"] = tag;
    }));
  };
  std::vector<std::pair<std::string, std::string>> cases;
  cases.emplace_back(error_of("longrope", [](auto& c) { c["rope_parameters"]["rope_type"] = "longrope"; }),
                     "type 'longrope' is not supported");
  fs::remove_all(tmp_ / "llama_gqa_untied");
  cases.emplace_back(error_of("gelu", [](auto& c) { c["hidden_act"] = "gelu"; }), "hidden_act 'gelu' is not supported");
  fs::remove_all(tmp_ / "llama_gqa_untied");
  cases.emplace_back(error_of("mlp_bias", [](auto& c) { c["mlp_bias"] = true; }), "mlp_bias = true is not supported");
  fs::remove_all(tmp_ / "llama_gqa_untied");
  cases.emplace_back(error_of("arch", [](auto& c) { c["architectures"] = {"GemmaForCausalLM"}; }),
                     "architecture 'GemmaForCausalLM'");
  fs::remove_all(tmp_ / "llama_gqa_untied");
  cases.emplace_back(error_of("window", [](auto& c) { c["layer_types"] = {"full_attention", "sliding_attention"}; }),
                     "only full_attention is supported");
  fs::remove_all(tmp_ / "llama_gqa_untied");
  cases.emplace_back(error_of("moe", [](auto& c) { c["num_local_experts"] = 8; }), "mixture-of-experts");
  fs::remove_all(tmp_ / "llama_gqa_untied");
  cases.emplace_back(error_of("heads", [](auto& c) { c["num_attention_heads"] = 0; }),
                     "'num_attention_heads' = 0 must be positive");
  fs::remove_all(tmp_ / "llama_gqa_untied");
  cases.emplace_back(error_of("awq", [](auto& c) { c["quantization_config"] = {{"quant_method", "awq"}}; }),
                     "quantization_config.quant_method 'awq' is not supported (fp8, block-wise e4m3)");
  fs::remove_all(tmp_ / "llama_gqa_untied");
  cases.emplace_back(error_of("block", [](auto& c) {
                       c["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {64, 64}}};
                     }),
                     "quantization_config.weight_block_size [64,64] is not supported ([128, 128])");
  for (const auto& [message, want] : cases) EXPECT_NE(message.find(want), std::string::npos) << message;
}

// Tensors: one the model needs and the file lacks, one the file has and the model does
// not use, a wrong shape, a shard the index names but that is gone: each an error
// naming it, never a silent drop.
TEST_F(HfDir, TensorsMissingUnusedOrMisshapedAreErrors) {
  const fs::path src = kFixtures / "llama_gqa_untied";
  const ModelConfig cfg = ModelConfig::from_deck(deck_for(src));
  Transformer m(cfg, 1, at::kCPU);
  auto load_error = [&](const std::vector<NamedTensor>& tensors) {
    fs::remove(tmp_ / "w.safetensors");
    write_safetensors((tmp_ / "w.safetensors").string(), tensors);
    try {
      load_model_weights(m.parameters(), (tmp_ / "w.safetensors").string());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::vector<NamedTensor> all = read_safetensors((src / "model.safetensors").string());
  EXPECT_EQ(load_error(all), "");
  std::vector<NamedTensor> fewer(all.begin() + 1, all.end());  // drops the first by name
  EXPECT_NE(load_error(fewer).find("the model needs tensors the files lack: " + all.front().name), std::string::npos);
  std::vector<NamedTensor> more = all;
  more.push_back({"model.layers.0.self_attn.o_proj.bias", at::zeros({32})});
  EXPECT_NE(load_error(more).find("the files hold tensors the model does not use: model.layers.0.self_attn.o_proj.bias"),
            std::string::npos);
  std::vector<NamedTensor> with_buffer = all;  // older Llama files store RoPE's inv_freq: not a parameter
  with_buffer.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", at::zeros({4})});
  EXPECT_EQ(load_error(with_buffer), "");
  std::vector<NamedTensor> bent = all;
  for (auto& t : bent)
    if (t.name == "model.norm.weight") t.tensor = at::ones({31});
  EXPECT_NE(load_error(bent).find("model.norm.weight is 31 Float, the model needs 32"), std::string::npos);

  const fs::path sharded = tmp_ / "sharded";
  fs::copy(kFixtures / "qwen2_linear_rope_sharded", sharded, fs::copy_options::recursive);
  fs::remove(sharded / "model-00003-of-00007.safetensors");
  Transformer q(ModelConfig::from_deck(deck_for(sharded)), 1, at::kCPU);
  try {
    load_model_weights(q.parameters(), sharded.string());
    ADD_FAILURE() << "a missing shard loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model-00003-of-00007.safetensors, which does not exist"), std::string::npos)
        << e.what();
  }
}

// A tied model's checkpoint may carry lm_head.weight as a copy of the embedding (some
// exports do): accepted when equal, an error when it is another matrix (the tie would
// silently drop it).
TEST_F(HfDir, StoredLmHeadOfATiedModelMustEqualTheEmbedding) {
  const fs::path src = kFixtures / "qwen3_tied";
  const ModelConfig cfg = ModelConfig::from_deck(deck_for(src));
  ASSERT_TRUE(cfg.tie_word_embeddings);
  Transformer m(cfg, 1, at::kCPU);
  std::vector<NamedTensor> all = read_safetensors((src / "model.safetensors").string());
  at::Tensor embed;
  for (const auto& t : all)
    if (t.name == "model.embed_tokens.weight") embed = t.tensor;
  all.push_back({"lm_head.weight", embed.clone()});
  write_safetensors((tmp_ / "same.safetensors").string(), all);
  EXPECT_NO_THROW(load_model_weights(m.parameters(), (tmp_ / "same.safetensors").string()));
  all.back().tensor = embed + 1;
  write_safetensors((tmp_ / "other.safetensors").string(), all);
  try {
    load_model_weights(m.parameters(), (tmp_ / "other.safetensors").string());
    ADD_FAILURE() << "a different lm_head loaded into a tied model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lm_head.weight (a tied model has no lm_head.weight"), std::string::npos)
        << e.what();
  }
}

// The architecture table: names unique, every dense model exports as exactly one dense
// family, and a mixture-of-experts model as at most one (each family's `fits` excludes
// the others'); a config.json names its family by class, or by model_type without one.
TEST(Architectures, OneFamilyPerModelAndLookupByClassOrType) {
  std::set<std::string> classes;
  for (const std::string& name : architectures().names()) {
    const Architecture& a = architectures().get(name);
    EXPECT_EQ(name, a.model_type);
    EXPECT_TRUE(classes.insert(a.hf_class).second) << a.hf_class;
    EXPECT_EQ(architecture_of_config(a.hf_class, "something else"), &a);
    EXPECT_EQ(architecture_of_config("", a.model_type), &a);
  }
  EXPECT_EQ(architecture_of_config("GPT2LMHeadModel", "gpt2"), nullptr);
  for (int bits = 0; bits < 64; ++bits) {
    ModelConfig cfg;
    cfg.qk_norm = bits & 1;
    cfg.qkv_bias = bits & 2;
    cfg.o_bias = (bits & 4) && cfg.qkv_bias;  // an o bias without q/k/v biases is refused before
    cfg.n_experts = bits & 8 ? 4 : 0;
    cfg.shared_expert_intermediate_size = bits & 16 ? 8 : 0;
    cfg.norm_topk_prob = bits & 32;
    int fitting = 0;
    for (const std::string& name : architectures().names()) {
      const Architecture& a = architectures().get(name);
      fitting += a.moe == (cfg.n_experts > 0) && a.fits(cfg);
    }
    if (cfg.n_experts > 0) EXPECT_LE(fitting, 1) << "flags " << bits;
    else EXPECT_EQ(fitting, 1) << "flags " << bits;
    EXPECT_EQ(export_architecture(cfg) != nullptr, fitting == 1) << "flags " << bits;
  }
  // Anything of DeepSeekMoE (or partial RoPE) exports as GLM-4.5 or not at all.
  ModelConfig glm;
  glm.n_experts = 4;
  glm.moe_router = "sigmoid";
  glm.moe_router_bias = true;
  glm.n_shared_experts = 1;
  glm.first_k_dense_replace = 1;
  EXPECT_EQ(export_architecture(glm), &architectures().get("glm4_moe"));
  glm.o_bias = glm.qkv_bias = true;
  EXPECT_EQ(export_architecture(glm), nullptr);
  ModelConfig partial;
  partial.partial_rotary_factor = 0.5;
  EXPECT_EQ(export_architecture(partial), nullptr);
  EXPECT_TRUE(is_hf_expert_name("model.layers.0.block_sparse_moe.experts.3.w1.weight"));
  EXPECT_TRUE(is_hf_expert_name("model.layers.0.mlp.experts.3.up_proj.weight"));
  EXPECT_FALSE(is_hf_expert_name("model.layers.0.mlp.shared_expert.up_proj.weight"));
}

}  // namespace
}  // namespace slimpi
