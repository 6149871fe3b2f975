// Speculative decoding (rollout.speculative = "mtp"): the chain verifier samples the
// target exactly (chi-square against p with a fixed seed; greedy keeps drafts while they
// are the arg-max; a draft equal to the target is always accepted); in the engine,
// greedy decoding with speculation gives greedy decoding's tokens and log-probs (with
// groups, shared prefixes, chunked prefill, preemption and MoE routing traces); an
// untrained draft still samples the policy (chi-square of the verified positions against
// the policy's own distributions); a draft built equal to the policy has every token
// accepted; no KV block leaks.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <slimpi/error.h>

#include <map>

#include "kernels/counter_rng.h"
#include "kernels/sampling.h"
#include "kernels/speculative.h"
#include "model/transformer.h"
#include "rollout/engine.h"
#include "tokenizer/byte_tokenizer.h"
#include "../../support/tiny_model.h"

namespace slimpi {
namespace {

// Pearson's statistic over the bins with expected counts; its critical value at a false-
// alarm rate of 1e-4 for `dof` degrees of freedom (Wilson-Hilferty: the chi-square
// quantile from the normal one, z = 3.719), accurate to ~1% for these dof.
double chi_square(const std::vector<double>& observed, const std::vector<double>& expected) {
  double x = 0;
  for (size_t i = 0; i < observed.size(); ++i)
    if (expected[i] > 0) x += (observed[i] - expected[i]) * (observed[i] - expected[i]) / expected[i];
  return x;
}
double critical_1e4(double dof) {
  const double z = 3.719, a = 2.0 / (9.0 * dof);
  return dof * std::pow(1 - a + z * std::sqrt(a), 3);
}

// A random row of logits.
std::vector<float> logits_row(int64_t V, uint64_t seed, double scale) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  at::Tensor z = at::randn({V}, g) * scale;
  return {z.data_ptr<float>(), z.data_ptr<float>() + V};
}

TEST(VerifyChain, GreedyKeepsDraftsWhileTheyAreTheArgmax) {
  const int64_t V = 5;
  const std::vector<float> z = {0, 3, 1, 0, 0,   // argmax 1
                                2, 0, 0, 0, 0,   // argmax 0
                                0, 0, 0, 4, 0};  // argmax 3
  const SamplingRow greedy{0.0, 0, 1.0, 0.5};
  const double u[2] = {0.5, 0.5};
  std::vector<int64_t> drafts = {1, 0};
  ChainVerdict v = verify_chain(z.data(), nullptr, drafts.data(), 2, V, greedy, u, u, 0.5);
  EXPECT_EQ(v.n_accepted, 2);
  EXPECT_EQ(v.tokens, (std::vector<int64_t>{1, 0, 3}));  // both drafts, then the bonus arg-max
  drafts = {1, 4};
  v = verify_chain(z.data(), nullptr, drafts.data(), 2, V, greedy, u, u, 0.5);
  EXPECT_EQ(v.n_accepted, 1);
  EXPECT_EQ(v.tokens, (std::vector<int64_t>{1, 0}));  // the second draft is not the arg-max: 0 instead
}

TEST(VerifyChain, ADraftEqualToTheTargetIsAlwaysAccepted) {
  const int64_t V = 40, D = 3;
  const SamplingRow rule{0.8, 0, 0.9, 0.5};
  std::vector<float> z, q(size_t(D * V));
  for (int64_t j = 0; j <= D; ++j) {
    const std::vector<float> row = logits_row(V, 10 + j, 2.0);
    z.insert(z.end(), row.begin(), row.end());
  }
  for (int64_t j = 0; j < D; ++j) sampling_distribution(z.data() + j * V, V, rule, q.data() + j * V);
  for (uint64_t trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> drafts;
    std::vector<double> a, r;
    for (int64_t j = 0; j < D; ++j) {  // drafts drawn from q itself
      const float* qj = q.data() + j * V;
      const double u = counter_uniform(5, trial, uint64_t(j));
      double c = 0;
      int64_t d = 0;
      for (; d < V - 1; ++d)
        if ((c += qj[d]) > u) break;
      drafts.push_back(d);
      a.push_back(counter_uniform(6, trial, uint64_t(j)));
      r.push_back(counter_uniform(7, trial, uint64_t(j)));
    }
    const ChainVerdict v = verify_chain(z.data(), q.data(), drafts.data(), D, V, rule, a.data(), r.data(),
                                        counter_uniform(8, trial, 0));
    ASSERT_EQ(v.n_accepted, D) << "trial " << trial;
  }
}

// The emitted tokens are distributed as the target's: token 1 as p_0 whatever q_1; token
// 2 (after an accepted d_1) as p_1. Top-p 0.9 cuts both distributions.
TEST(VerifyChain, EmittedTokensFollowTheTargetWhateverTheDraft) {
  const int64_t V = 6, D = 2;
  const SamplingRow rule{1.0, 0, 0.9, 0.5};
  std::vector<float> z, zq;
  for (int64_t j = 0; j <= D; ++j) {
    const std::vector<float> row = logits_row(V, 20 + j, 1.0);
    z.insert(z.end(), row.begin(), row.end());
  }
  for (int64_t j = 0; j < D; ++j) {
    const std::vector<float> row = logits_row(V, 30 + j, 1.5);  // a draft unlike the target
    zq.insert(zq.end(), row.begin(), row.end());
  }
  std::vector<float> p(size_t(2 * V)), q(size_t(D * V));
  for (int64_t j = 0; j < 2; ++j) sampling_distribution(z.data() + j * V, V, rule, p.data() + j * V);
  for (int64_t j = 0; j < D; ++j) sampling_distribution(zq.data() + j * V, V, rule, q.data() + j * V);
  const int64_t N = 40000;
  std::vector<double> first(size_t(V), 0), second(size_t(V), 0);
  double n_second = 0, accepted = 0;
  for (int64_t t = 0; t < N; ++t) {
    std::vector<int64_t> drafts;
    std::vector<double> a, r;
    for (int64_t j = 0; j < D; ++j) {
      const float* qj = q.data() + j * V;
      const double u = counter_uniform(11, uint64_t(t), uint64_t(j));
      double c = 0;
      int64_t d = 0;
      for (; d < V - 1; ++d)
        if ((c += qj[d]) > u) break;
      drafts.push_back(d);
      a.push_back(counter_uniform(12, uint64_t(t), uint64_t(j)));
      r.push_back(counter_uniform(13, uint64_t(t), uint64_t(j)));
    }
    const ChainVerdict v =
        verify_chain(z.data(), q.data(), drafts.data(), D, V, rule, a.data(), r.data(), counter_uniform(14, uint64_t(t), 0));
    first[size_t(v.tokens[0])] += 1;
    accepted += double(v.n_accepted);
    if (v.n_accepted >= 1) {
      second[size_t(v.tokens[1])] += 1;
      n_second += 1;
    }
  }
  auto check = [&](const std::vector<double>& observed, const float* probs, double n, const char* what) {
    std::vector<double> expected;
    int dof = -1;
    for (int64_t v = 0; v < V; ++v) {
      expected.push_back(n * probs[v]);
      if (probs[v] > 0) ++dof;
      else EXPECT_EQ(observed[size_t(v)], 0) << what << ": token " << v << " outside the target's support";
    }
    ASSERT_GT(dof, 0);
    EXPECT_LT(chi_square(observed, expected), critical_1e4(dof)) << what;
  };
  check(first, p.data(), double(N), "token 1");
  check(second, p.data() + V, n_second, "token 2 after an accepted draft");
  EXPECT_GT(accepted, 0.2 * N);  // both paths ran: acceptances and rejections
  EXPECT_LT(accepted, 1.8 * N);
}

// --- the engine ---

ModelConfig spec_model(int64_t vocab = 260, bool moe = false) {
  ModelConfig c = testing::tiny_model_config(96, 0.2);
  c.vocab_size = vocab;
  c.mtp_num_layers = 1;
  if (moe) {
    c.n_experts = 4;
    c.n_experts_per_tok = 2;
    c.moe_intermediate_size = 32;
  }
  return c;
}

std::vector<GenerationRequest> requests(int n_groups, int64_t n_samples, double temperature, double top_p,
                                        int64_t shared_prefix = 0) {
  std::vector<GenerationRequest> out;
  for (int g = 0; g < n_groups; ++g) {
    GenerationRequest r;
    r.group_index = g;
    r.prompt = {ByteTokenizer::kBos};
    for (int64_t i = 0; i < shared_prefix; ++i) r.prompt.push_back(60 + i % 13);
    for (int64_t i = 0; i < 4 + (g * 7) % 11; ++i) r.prompt.push_back((g * 31 + i * 7) % 256);
    r.n_samples = n_samples;
    r.params.temperature = temperature;
    r.params.top_p = top_p;
    r.params.max_new_tokens = 6 + (g * 5) % 19;  // responses of different lengths
    r.params.stop_token_ids = {ByteTokenizer::kEos};
    r.seed = mix_seed(99, 0, uint64_t(g));
    out.push_back(r);
  }
  return out;
}

std::vector<Sample> run(const Transformer& m, EngineConfig cfg, const std::vector<GenerationRequest>& reqs,
                        EngineStats* stats = nullptr) {
  Engine e(cfg, m);
  for (const auto& r : reqs) e.add_request(r);
  std::vector<Sample> out = e.run_to_completion();
  EXPECT_EQ(e.n_free_blocks() + e.prefix_cache().n_nodes(), e.n_blocks()) << "KV blocks leaked";
  if (stats) *stats = e.stats();
  return out;
}

EngineConfig engine(int64_t spec_steps, int64_t kv_tokens = 8192) {
  EngineConfig c{4, kv_tokens, 16, 512, true};
  c.spec_steps = spec_steps;
  return c;
}

void expect_same(const std::vector<Sample>& a, const std::vector<Sample>& b, bool routing = false) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string what = "group " + std::to_string(a[i].group_index) + " sample " + std::to_string(a[i].index);
    ASSERT_EQ(a[i].tokens, b[i].tokens) << what;
    ASSERT_EQ(a[i].rollout_log_probs.size(), b[i].rollout_log_probs.size()) << what;
    for (size_t t = 0; t < a[i].rollout_log_probs.size(); ++t)
      EXPECT_NEAR(a[i].rollout_log_probs[t], b[i].rollout_log_probs[t], 2e-5) << what << " token " << t;
    EXPECT_EQ(a[i].status, b[i].status) << what;
    if (routing) EXPECT_EQ(a[i].routing, b[i].routing) << what;
  }
}

TEST(SpeculativeEngine, GreedySpeculationGivesGreedyDecoding) {
  Transformer m(spec_model(), 3, at::kCPU);
  const auto reqs = requests(8, 1, 0.0, 1.0, /*shared_prefix=*/9);
  const std::vector<Sample> plain = run(m, engine(0), reqs);
  for (int64_t steps : {1, 3}) {
    EngineStats st;
    const std::vector<Sample> spec = run(m, engine(steps), reqs, &st);
    expect_same(plain, spec);
    EXPECT_GT(st.spec_passes, 0);
    EXPECT_EQ(st.spec_drafted, [&] { int64_t n = 0; for (int j = 0; j < steps; ++j) n += st.spec_offered_at[j]; return n; }());
    int64_t drafted = 0, accepted = 0;
    for (const Sample& s : spec) {
      drafted += s.spec_drafted;
      accepted += s.spec_accepted;
    }
    EXPECT_EQ(drafted, st.spec_drafted);
    EXPECT_EQ(accepted, st.spec_accepted);
  }
}

TEST(SpeculativeEngine, GreedyHoldsWithGroupsChunkedPrefillAndPreemption) {
  Transformer m(spec_model(), 4, at::kCPU);
  auto reqs = requests(6, 3, 0.0, 1.0, /*shared_prefix=*/5);
  for (auto& r : reqs) r.params.temperature = 0.0;
  EngineConfig roomy = engine(0);
  roomy.chunked_prefill_tokens = 8;
  const std::vector<Sample> plain = run(m, roomy, reqs);
  EngineConfig tight = engine(3, 4 * 16);  // 16 blocks of 4: sequences are preempted and recomputed
  tight.chunked_prefill_tokens = 8;
  EngineStats st;
  const std::vector<Sample> spec = run(m, tight, reqs, &st);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.spec_passes, 0);
  expect_same(plain, spec);
}

// Drafts take what decoding and prefill leave: a chain never preempts a sequence (at the
// smallest cache where plain decoding needs no preemption, speculation needs none either)
// and never holds back a decode or a prefill (a batch budget barely above the running
// count still gives greedy decoding's tokens).
TEST(SpeculativeEngine, DraftsNeverPreemptNorDisplaceDecodes) {
  Transformer m(spec_model(), 6, at::kCPU);
  const auto reqs = requests(6, 2, 0.0, 1.0);
  const std::vector<Sample> plain = run(m, engine(0), reqs);
  int64_t smallest = 0;
  for (int64_t blocks = 20; blocks <= 256 && smallest == 0; ++blocks) {
    EngineStats st;
    EXPECT_EQ(run(m, engine(0, 4 * blocks), reqs, &st).size(), plain.size());
    if (st.preemptions == 0) smallest = blocks;
  }
  ASSERT_GT(smallest, 20);  // tight: at 20 blocks plain decoding preempts
  EngineStats st;
  expect_same(plain, run(m, engine(3, 4 * smallest), reqs, &st));
  EXPECT_EQ(st.preemptions, 0);
  EXPECT_GT(st.spec_passes, 0);

  EngineConfig narrow = engine(3);
  narrow.max_running = 12;
  narrow.max_batch_tokens = 14;  // 12 decodes leave 2 tokens for prompts and drafts
  expect_same(plain, run(m, narrow, reqs, &st));
  EXPECT_GT(st.spec_passes, 0);
}

TEST(SpeculativeEngine, MixtureOfExpertsKeepsTheAcceptedTokensRoutingTraces) {
  Transformer m(spec_model(260, /*moe=*/true), 5, at::kCPU);
  const auto reqs = requests(5, 2, 0.0, 1.0);
  const std::vector<Sample> plain = run(m, engine(0), reqs);
  const std::vector<Sample> spec = run(m, engine(2), reqs);
  expect_same(plain, spec, /*routing=*/true);
}

// DeepSeekMoE (GLM-4.5's, DeepSeek-V3's): the MTP depth is an MoE layer itself; drafted
// by it, greedy speculation still gives greedy decoding's tokens and routing traces.
TEST(SpeculativeEngine, DeepSeekMoeDraftFromAnMoeMtpLayer) {
  ModelConfig c = spec_model(260, /*moe=*/true);
  testing::use_deepseek_moe(c, /*n_group=*/1, /*topk_group=*/1, /*first_k_dense=*/0);
  c.partial_rotary_factor = 0.5;
  ASSERT_TRUE(c.mtp_is_moe());
  Transformer m(c, 5, at::kCPU);
  EXPECT_NO_THROW(m.parameter("model.mtp_layers.0.mlp.experts.3.up_proj.weight"));
  const auto reqs = requests(5, 2, 0.0, 1.0);
  const std::vector<Sample> plain = run(m, engine(0), reqs);
  EngineStats st;
  const std::vector<Sample> spec = run(m, engine(2), reqs, &st);
  EXPECT_GT(st.spec_accepted, 0);
  expect_same(plain, spec, /*routing=*/true);
}

// The policy's own distribution (after the rule) of the token after `prefix`.
std::vector<float> policy_distribution(const Transformer& m, const std::vector<int64_t>& prefix, const SamplingRow& rule) {
  at::NoGradGuard no_grad;
  const at::Tensor logits = m.forward_packed(at::tensor(prefix, at::kLong), {int64_t(prefix.size())})[-1].contiguous();
  std::vector<float> p(size_t(m.config().vocab_size));
  sampling_distribution(logits.data_ptr<float>(), m.config().vocab_size, rule, p.data());
  return p;
}

TEST(SpeculativeEngine, AnUntrainedDraftStillSamplesThePolicy) {
  // A small vocabulary so that the distributions are wide enough to bin; the tokens at
  // response positions 1 and 2 (each decided by a verify pass) against the policy's own
  // distribution given the sampled prefix, pooled over the samples (Pearson's statistic
  // over sums of non-identical categoricals is at most chi-square-dispersed).
  Transformer m(spec_model(24), 6, at::kCPU);
  auto reqs = requests(48, 16, 1.0, 0.9);
  for (auto& r : reqs) {
    for (auto& t : r.prompt) t = t % 24;
    r.params.max_new_tokens = 3;
    r.params.stop_token_ids = {};
  }
  EngineStats st;
  const std::vector<Sample> spec = run(m, engine(2), reqs, &st);
  EXPECT_GT(st.spec_accepted, 0);
  EXPECT_LT(st.spec_accepted, st.spec_drafted) << "no draft was rejected: the test would not see the residual";
  const SamplingRow rule{1.0, 0, 0.9, 0.5};
  for (int64_t position : {1, 2}) {
    std::vector<double> observed(24, 0), expected(24, 0);
    for (const Sample& s : spec) {
      const std::vector<int64_t> prefix(s.tokens.begin(), s.tokens.begin() + s.prompt_length + position);
      const std::vector<float> p = policy_distribution(m, prefix, rule);
      for (size_t v = 0; v < p.size(); ++v) expected[v] += p[v];
      observed[size_t(s.tokens[size_t(s.prompt_length + position)])] += 1;
    }
    int dof = -1;
    for (double e : expected) dof += e > 0;
    EXPECT_LT(chi_square(observed, expected), critical_1e4(dof)) << "response position " << position;
  }
}

// A draft built to equal the policy: one layer whose attention output is zero (so each
// position's logits are a function of its token alone: the draft's entries, which never
// see the first token, lose nothing), embedding rows of RMS 1 (the draft's token norm
// passes them through), the MTP layer a copy of the trunk's reading the embedding half
// of its input projection only, its final norm the trunk's. Each draft is then the
// trunk's distribution at its position: q = p, and every draft stands, sampled or greedy.
TEST(SpeculativeEngine, ADraftEqualToThePolicyHasEveryTokenAccepted) {
  ModelConfig c = spec_model();
  c.n_layers = 1;
  Transformer m(c, 7, at::kCPU);
  {
    at::NoGradGuard no_grad;
    at::Tensor& e = m.parameter("model.embed_tokens.weight");
    e.copy_(e / e.pow(2).mean(1, true).sqrt());
    m.parameter("model.layers.0.self_attn.o_proj.weight").zero_();
    const int64_t d = c.hidden_size;
    at::Tensor& proj = m.parameter("model.mtp_layers.0.input_proj.weight");
    proj.zero_();
    proj.narrow(1, d, d).copy_(at::eye(d));
    for (const auto& p : m.parameters()) {
      const std::string trunk = "model.layers.0.";
      if (p.name.rfind(trunk, 0) == 0) m.parameter("model.mtp_layers.0." + p.name.substr(trunk.size())).copy_(p.tensor);
    }
    m.parameter("model.mtp_layers.0.final_layernorm.weight").copy_(m.parameter("model.norm.weight"));
  }
  for (double temperature : {0.0, 1.0}) {
    EngineStats st;
    run(m, engine(3), requests(6, 2, temperature, 1.0), &st);
    EXPECT_GT(st.spec_drafted, 20);
    EXPECT_EQ(st.spec_accepted, st.spec_drafted) << "temperature " << temperature;
  }
}

TEST(SpeculativeEngine, ModelsWithoutMtpLayersAreRefused) {
  Transformer m(testing::tiny_model_config(96, 0.2), 3, at::kCPU);
  EXPECT_THROW(Engine e(engine(2), m), Error);
}

}  // namespace
}  // namespace slimpi
