// Prefill/decode disaggregation within one process (the MPI routing is
// tests/mpi/test_disaggregation.cpp): a prefill engine's KV rows, through their message
// bytes, into a decode engine give exactly one plain engine's samples (tokens, log-probs,
// MoE routing traces), with prefix sharing on both sides, chunked prefill, preemption on
// the decode side, a one-token prompt, bf16 and an e4m3 KV cache, latent attention's
// latent rows (DeepSeek-V3's shape), a hybrid model's linear-layer state; the rows are the
// prompt's positions but its last; a transfer that does not fit the decode engine's cache,
// or a cut message, is refused naming the group.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <slimpi/error.h>

#include "kernels/counter_rng.h"
#include "rollout/engine.h"
#include "rollout/kv_transfer.h"
#include "tokenizer/byte_tokenizer.h"
#include "../../support/tiny_model.h"

namespace slimpi {
namespace {

std::vector<GenerationRequest> requests(int n_groups, int64_t n_samples, double temperature, int64_t header) {
  std::vector<GenerationRequest> out;
  for (int g = 0; g < n_groups; ++g) {
    GenerationRequest r;
    r.group_index = g;
    r.prompt = {ByteTokenizer::kBos};
    if (g > 0) {  // group 0: the one-token prompt (nothing to hand over)
      for (int64_t i = 0; i < header; ++i) r.prompt.push_back(40 + i);  // shared: prefix-cache hits
      for (int i = 0; i < 2 + (g * 7) % 19; ++i) r.prompt.push_back((g * 31 + i * 7) % 256);
    }
    r.n_samples = n_samples;
    r.params.temperature = temperature;
    r.params.max_new_tokens = 20;
    r.params.stop_token_ids = {ByteTokenizer::kEos};
    r.seed = mix_seed(4321, 0, uint64_t(g));
    out.push_back(r);
  }
  return out;
}

// A group as work that moves between engines (Engine::add_prefilled takes work items).
WorkItem group_of(const GenerationRequest& r) {
  WorkItem w;
  w.request = r;
  return w;
}

std::vector<Sample> sorted(std::vector<Sample> v) {
  std::sort(v.begin(), v.end(),
            [](const auto& a, const auto& b) { return std::tie(a.group_index, a.index) < std::tie(b.group_index, b.index); });
  return v;
}

std::vector<Sample> plain(const Transformer& m, const EngineConfig& cfg, const std::vector<GenerationRequest>& reqs) {
  Engine e(cfg, m);
  for (const auto& r : reqs) e.add_request(r);
  return e.run_to_completion();
}

struct Disaggregated {
  std::vector<Sample> samples;
  EngineStats prefill, decode;
};

// One prefill engine and one decode engine, stepped in turn; every transfer goes through
// its message bytes.
Disaggregated disaggregated(const Transformer& m, EngineConfig prefill_cfg, const EngineConfig& decode_cfg,
                            const std::vector<GenerationRequest>& reqs) {
  prefill_cfg.prefill_only = true;
  Engine p(prefill_cfg, m), d(decode_cfg, m);
  for (const auto& r : reqs) p.add_request(r);
  Disaggregated out;
  while (p.has_work() || d.has_work()) {
    if (p.has_work()) {
      EXPECT_TRUE(p.step().empty()) << "a prefill engine sampled";
      for (auto& [request, kv] : p.take_prefilled()) {
        EXPECT_EQ(kv.n_positions, int64_t(request.prompt.size()) - 1) << "group " << request.group_index;
        d.add_prefilled(group_of(request), decode_kv_transfer(encode_kv_transfer(kv)));
      }
    }
    if (d.has_work())
      for (auto& s : d.step()) out.samples.push_back(std::move(s));
  }
  EXPECT_EQ(p.n_free_blocks() + p.prefix_cache().n_nodes(), p.n_blocks()) << "prefill engine leaked KV blocks";
  EXPECT_EQ(d.n_free_blocks() + d.prefix_cache().n_nodes(), d.n_blocks()) << "decode engine leaked KV blocks";
  out.samples = sorted(std::move(out.samples));
  out.prefill = p.stats();
  out.decode = d.stats();
  return out;
}

void expect_same_samples(const std::vector<Sample>& a, const std::vector<Sample>& b, double logp_tol = 1e-5) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "group " << a[i].group_index << " sample " << a[i].index);
    EXPECT_EQ(a[i].group_index, b[i].group_index);
    EXPECT_EQ(a[i].index, b[i].index);
    EXPECT_EQ(a[i].tokens, b[i].tokens);
    EXPECT_EQ(a[i].status, b[i].status);
    EXPECT_EQ(a[i].routing, b[i].routing);
    ASSERT_EQ(a[i].rollout_log_probs.size(), b[i].rollout_log_probs.size());
    for (size_t t = 0; t < a[i].rollout_log_probs.size(); ++t)
      EXPECT_NEAR(a[i].rollout_log_probs[t], b[i].rollout_log_probs[t], logp_tol);
  }
}

TEST(Disaggregation, PrefillThenDecodeGivesOnePlainEnginesSamples) {
  Transformer m(testing::tiny_model_config(128, 0.2), 3, at::kCPU);
  const auto reqs = requests(12, 4, 1.0, /*header=*/9);
  const EngineConfig cfg{4, 8192, 16, 256, true};
  const std::vector<Sample> one = plain(m, cfg, reqs);
  const EngineConfig four_at_once{4, 8192, 4, 256, true};  // later prompts find the header cached
  const Disaggregated pd = disaggregated(m, four_at_once, cfg, reqs);
  expect_same_samples(one, pd.samples);
  std::set<std::vector<int64_t>> distinct;
  for (const auto& s : one) distinct.insert(s.response());
  EXPECT_GT(distinct.size(), one.size() / 2) << "the samples hardly vary: the test shows little";

  // Every prompt position but the last is handed over once; the decode engine computes
  // the last (and nothing else of a prompt); the prefill engine samples nothing.
  int64_t handed = 0;
  for (const auto& r : reqs) handed += int64_t(r.prompt.size()) - 1;
  EXPECT_EQ(pd.prefill.kv_sent_tokens, handed);
  EXPECT_EQ(pd.decode.kv_received_tokens, handed);
  EXPECT_EQ(pd.prefill.kv_sent_bytes, pd.decode.kv_received_bytes);
  const KvCache like = KvCache::allocate(m.config(), 1, at::TensorOptions().dtype(at::kFloat));
  EXPECT_EQ(pd.prefill.kv_sent_bytes, handed * like.bytes_per_token());
  EXPECT_EQ(pd.prefill.generated_tokens, 0);
  EXPECT_EQ(pd.decode.prefill_tokens_computed, int64_t(reqs.size()));  // each prompt's last token
  EXPECT_GT(pd.prefill.prefix_hit_tokens, 0) << "the prefill engine's prefix cache found no shared header";
  // Prompt queries and hits count where prompts are computed, once: not again on the
  // decode side (whose hits only save memory there), except for a sample the decode engine
  // preempted and admits again (none here: it has room for every sample).
  int64_t prompt_tokens = 0;
  for (const auto& r : reqs) prompt_tokens += int64_t(r.prompt.size());
  EXPECT_EQ(pd.prefill.prefix_query_tokens, prompt_tokens);
  ASSERT_EQ(pd.decode.preemptions, 0);
  EXPECT_EQ(pd.decode.prefix_query_tokens, 0);
  EXPECT_EQ(pd.decode.prefix_hit_tokens, 0);
}

TEST(Disaggregation, ChunkedPrefillAndDecodePreemptionKeepTheSamples) {
  Transformer m(testing::tiny_model_config(256, 0.2), 5, at::kCPU);
  auto reqs = requests(6, 3, 1.0, /*header=*/0);
  for (size_t g = 1; g < reqs.size(); ++g)  // long prompts, 41..121 tokens
    for (int64_t i = 0; i < 40 + 20 * int64_t(g - 1); ++i) reqs[g].prompt.push_back((g * 11 + i * 3) % 256);
  for (auto& r : reqs) r.params.max_new_tokens = 40;
  const std::vector<Sample> one = plain(m, EngineConfig{4, 8192, 32, 512, true}, reqs);
  EngineConfig chunked{4, 8192, 32, 512, true};
  chunked.chunked_prefill_tokens = 24;
  const EngineConfig tight{4, 4 * 48, 32, 512, true};  // 48 blocks of 4: the decode engine preempts
  const Disaggregated pd = disaggregated(m, chunked, tight, reqs);
  expect_same_samples(one, pd.samples);
  EXPECT_GT(pd.decode.preemptions, 0);
  EXPECT_LE(pd.prefill.forward_tokens, pd.prefill.kv_sent_tokens) << "the prefill engine computed a token twice";
}

TEST(Disaggregation, MixtureOfExpertsRoutingAndBf16WithAnE4m3Cache) {
  ModelConfig c = testing::tiny_model_config(128, 0.3);
  c.n_experts = 4;
  c.n_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  Transformer masters(c, 7, at::kCPU), bf16(c, 7, at::kCPU, at::kBFloat16);
  bf16.copy_weights_from(masters);
  const auto reqs = requests(8, 3, 1.0, /*header=*/6);
  EngineConfig cfg{4, 8192, 16, 256, true};
  expect_same_samples(plain(masters, cfg, reqs), disaggregated(masters, cfg, cfg, reqs).samples);
  cfg.kv_cache_dtype = at::kFloat8_e4m3fn;
  const std::vector<Sample> one = plain(bf16, cfg, reqs);
  const Disaggregated pd = disaggregated(bf16, cfg, cfg, reqs);
  expect_same_samples(one, pd.samples);
  ASSERT_FALSE(one.back().routing.empty());
  const KvCache e4m3 = KvCache::allocate(c, 1, at::TensorOptions().dtype(at::kFloat8_e4m3fn));
  const int64_t routing_bytes = 2 * c.n_moe_layers() * c.n_experts_per_tok;  // int16 a choice
  EXPECT_EQ(pd.prefill.kv_sent_bytes, pd.prefill.kv_sent_tokens * (e4m3.bytes_per_token() + routing_bytes));
}

// A DeepSeek-V3-shaped model (latent attention, DeepSeekMoE): the handed-over rows are
// the latent cache's (kv_lora_rank + qk_rope_head_dim per row, not per-head keys and
// values); the decode engine's absorbed decode over them gives one plain engine's
// samples, fp32 and bf16 with an e4m3 cache, with the prefix cache and preemption.
TEST(Disaggregation, LatentAttentionHandsOverTheLatentRows) {
  ModelConfig c = testing::tiny_model_config(128, 0.3);
  c.n_experts = 4;
  c.n_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  testing::use_deepseek_moe(c, /*n_group=*/2, /*topk_group=*/1, /*first_k_dense=*/1);
  testing::use_latent_attention(c);
  Transformer masters(c, 11, at::kCPU), bf16(c, 11, at::kCPU, at::kBFloat16);
  bf16.copy_weights_from(masters);
  const auto reqs = requests(8, 3, 1.0, /*header=*/6);
  EngineConfig cfg{4, 8192, 16, 256, true};
  const EngineConfig tight{4, 4 * 20, 16, 256, true};  // 20 blocks of 4: the decode engine preempts
  const std::vector<Sample> one = plain(masters, cfg, reqs);
  const EngineConfig four_at_once{4, 8192, 4, 256, true};  // later prompts find the header cached
  const Disaggregated fp32 = disaggregated(masters, four_at_once, tight, reqs);
  expect_same_samples(one, fp32.samples);
  EXPECT_GT(fp32.decode.preemptions, 0);
  EXPECT_GT(fp32.prefill.prefix_hit_tokens, 0);
  const int64_t routing_bytes = 2 * c.n_moe_layers() * c.n_experts_per_tok;  // int16 a choice
  const int64_t latent_bytes = 4 * c.n_layers * (c.kv_lora_rank + c.qk_rope_head_dim);  // fp32, one row a layer
  EXPECT_EQ(fp32.prefill.kv_sent_bytes, fp32.prefill.kv_sent_tokens * (latent_bytes + routing_bytes));
  cfg.kv_cache_dtype = at::kFloat8_e4m3fn;
  const Disaggregated e4m3 = disaggregated(bf16, cfg, cfg, reqs);
  expect_same_samples(plain(bf16, cfg, reqs), e4m3.samples);
  EXPECT_EQ(e4m3.prefill.kv_sent_bytes, e4m3.prefill.kv_sent_tokens * (latent_bytes / 4 + routing_bytes));
}

// A hybrid model (Qwen3.5's shape): its linear layers cache no rows, so the prefill
// engine hands over the full-attention layer's rows and the sequence's linear-layer state
// after the prompt's last-but-one position (each layer's convolution and recurrent state,
// fp32), and the decode engine continues from that state: one plain engine's samples,
// with the prompts prefilled in chunks and the decode engine preempting (a preempted
// sequence recomputes from position 0). A decode engine whose linear layers have another
// shape refuses the state, naming the group.
TEST(Disaggregation, HybridModelsHandOverTheLinearLayersState) {
  ModelConfig c = testing::tiny_model_config(128, 0.2);
  testing::use_gated_delta_net(c);
  // (the gated norm's round-off amplification bounded by 1/sqrt(eps) = 1e2:
  // tests/unit/rollout/test_engine_hybrid.cpp; the two sides compute the prompt in other pieces)
  c.rms_norm_eps = 1e-4;
  Transformer m(c, 3, at::kCPU);
  const auto reqs = requests(8, 3, 1.0, /*header=*/6);
  const EngineConfig cfg{4, 8192, 16, 256, false};
  EngineConfig chunked = cfg;
  chunked.chunked_prefill_tokens = 8;
  const EngineConfig tight{4, 4 * 20, 16, 256, false};  // 20 blocks of 4: the decode engine preempts
  const Disaggregated pd = disaggregated(m, chunked, tight, reqs);
  expect_same_samples(plain(m, cfg, reqs), pd.samples, 3e-4);
  EXPECT_GT(pd.decode.preemptions, 0);
  const KvCache like = KvCache::allocate(c, 1, at::TensorOptions().dtype(at::kFloat), 1, 0, true, /*n_state_slots=*/1);
  int64_t handed = 0, with_rows = 0;
  for (const auto& r : reqs) {
    handed += int64_t(r.prompt.size()) - 1;
    with_rows += r.prompt.size() > 1;
  }
  EXPECT_GT(like.state_bytes_per_sequence(), 0);
  EXPECT_EQ(pd.prefill.kv_sent_bytes, handed * like.bytes_per_token() + with_rows * like.state_bytes_per_sequence());

  ModelConfig other = c;
  other.linear_value_head_dim = 4;
  Transformer m_other(other, 3, at::kCPU);
  EngineConfig prefill_cfg = cfg;
  prefill_cfg.prefill_only = true;
  Engine p(prefill_cfg, m), d(cfg, m_other);
  p.add_request(reqs[1]);
  while (p.has_work()) p.step();
  auto handed_over = p.take_prefilled();
  ASSERT_EQ(handed_over.size(), 1u);
  d.add_prefilled(group_of(handed_over[0].first), decode_kv_transfer(encode_kv_transfer(handed_over[0].second)));
  try {
    d.step();
    FAIL() << "a state of another shape was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group 1: linear-layer state tensor"), std::string::npos) << e.what();
  }
}

// An episode's turn (rollout/disaggregated_episodes.h): a partial sample whose sequence
// goes on after tokens it did not sample (and a later context's opening, nothing sampled
// yet), prefilled by a prefill engine as a context of its own, continues on the decode
// engine exactly as on a plain engine that recomputes it, and the decode engine computes
// none of its positions but the last.
TEST(Disaggregation, ATurnPrefilledElsewhereContinuesAsOnAPlainEngine) {
  Transformer m(testing::tiny_model_config(128, 0.2), 3, at::kCPU);
  const EngineConfig cfg{4, 1024, 4, 64, true};
  const auto reqs = requests(3, 1, 1.0, 6);
  std::vector<WorkItem> turns;  // each group's sample after 8 tokens, then 5 tokens of an observation
  Engine first(cfg, m);
  for (GenerationRequest r : reqs) {
    r.params.max_new_tokens = 8;
    first.add_request(r);
  }
  for (Sample& s : first.run_to_completion()) {
    WorkItem w;
    w.request = reqs[size_t(s.group_index)];
    w.request.params.max_new_tokens = 30;
    w.partial = std::move(s);
    w.partial.status = SampleStatus::Pending;
    const size_t r = size_t(w.partial.response_length()) + 5;
    for (int i = 0; i < 5; ++i) w.partial.tokens.push_back(100 + i);
    w.partial.rollout_log_probs.resize(r, 0.0f);
    w.partial.weight_versions.resize(r, 0);
    if (!w.partial.sampling_support.empty()) w.partial.sampling_support.resize(r, 0);
    turns.push_back(std::move(w));
  }
  WorkItem opening;  // a later context's first turn: its opening tokens as the prompt, nothing sampled yet
  opening.request = reqs[2];
  opening.request.group_index = 3;
  opening.request.prompt.insert(opening.request.prompt.end(), {110, 111, 112});
  opening.request.seed = mix_seed(4321, 1, 3);
  opening.partial.group_index = 3;
  opening.partial.tokens = opening.request.prompt;
  opening.partial.prompt_length = int64_t(opening.request.prompt.size());
  turns.push_back(opening);
  ASSERT_EQ(turns.size(), 4u);
  Engine plain(cfg, m);
  for (const WorkItem& w : turns) plain.add_work(w);
  const std::vector<Sample> expected = plain.run_to_completion();

  EngineConfig prefill_cfg = cfg;
  prefill_cfg.prefill_only = true;
  Engine p(prefill_cfg, m), d(cfg, m);
  for (size_t i = 0; i < turns.size(); ++i) {
    GenerationRequest context;  // as a decode engine sends it: a ticket and the sequence's tokens
    context.group_index = 100 + int64_t(i);
    context.prompt = turns[i].partial.tokens;
    context.params.max_new_tokens = 1;
    p.add_request(context);
  }
  while (p.has_work()) EXPECT_TRUE(p.step().empty());
  for (auto& [context, kv] : p.take_prefilled()) {
    const WorkItem& w = turns[size_t(context.group_index - 100)];
    EXPECT_EQ(kv.n_positions, int64_t(w.partial.tokens.size()) - 1);
    kv.group_index = w.request.group_index;
    d.add_prefilled(w, decode_kv_transfer(encode_kv_transfer(kv)));
  }
  const std::vector<Sample> got = d.run_to_completion();
  // The plain engine computed every position again; the decode engine each sequence's last
  // token alone: a decode row after a response, a prompt token of the opening (counted).
  EXPECT_GT(plain.stats().prefill_tokens_computed, 0);
  EXPECT_EQ(d.stats().prefill_tokens_computed, 1) << "the decode engine recomputed a context";
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "group " << got[i].group_index);
    EXPECT_EQ(got[i].group_index, turns[i].request.group_index);
    EXPECT_GT(got[i].response_length(), turns[i].partial.response_length());
    EXPECT_EQ(got[i].tokens, expected[i].tokens);
    ASSERT_EQ(got[i].rollout_log_probs.size(), expected[i].rollout_log_probs.size());
    for (size_t t = 0; t < got[i].rollout_log_probs.size(); ++t)
      EXPECT_NEAR(got[i].rollout_log_probs[t], expected[i].rollout_log_probs[t],
                  1e-5 * std::max(1.0f, std::abs(expected[i].rollout_log_probs[t])));  // fp32 round-off
  }
}

TEST(Disaggregation, RefusesRowsThatDoNotFitAndCutMessages) {
  Transformer m(testing::tiny_model_config(128, 0.2), 3, at::kCPU);
  const auto reqs = requests(2, 1, 1.0, 6);
  EngineConfig prefill_cfg{4, 1024, 4, 64, true};
  prefill_cfg.prefill_only = true;
  Engine p(prefill_cfg, m);
  p.add_request(reqs[1]);
  while (p.has_work()) p.step();
  auto handed = p.take_prefilled();
  ASSERT_EQ(handed.size(), 1u);
  const std::string bytes = encode_kv_transfer(handed[0].second);

  EngineConfig bf16_cache{4, 1024, 4, 64, true};
  bf16_cache.kv_cache_dtype = at::kBFloat16;  // fp32 rows into a bf16 cache
  Engine d(bf16_cache, m);
  d.add_prefilled(group_of(reqs[1]), decode_kv_transfer(bytes));
  try {
    d.step();
    FAIL() << "rows of another cache layout were written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bytes a position"), std::string::npos) << e.what();
  }
  EXPECT_THROW(decode_kv_transfer(bytes.substr(0, bytes.size() - 3)), Error);
  Engine other(EngineConfig{4, 1024, 4, 64, true}, m);
  EXPECT_THROW(other.add_prefilled(group_of(reqs[0]), decode_kv_transfer(bytes)), Error);  // another group's rows
}

}  // namespace
}  // namespace slimpi
