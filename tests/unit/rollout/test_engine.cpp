// The rollout engine: greedy equals a plain no-cache loop; a group's prompt is
// prefilled once; seeded samples do not depend on batch size, prefix caching or
// preemption; stop conditions; engine log-probs equal the trainer's; no block leaks.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <slimpi/error.h>

#include <functional>

#include "kernels/counter_rng.h"
#include "model/precision.h"
#include "rollout/engine.h"
#include "sync/fp8_weights.h"
#include "tokenizer/byte_tokenizer.h"
#include "../../support/logp_gap.h"
#include "../../support/tiny_model.h"

namespace slimpi {
namespace {

ModelConfig model_config() { return testing::tiny_model_config(96, 0.2); }  // peaky: varied samples

std::vector<int64_t> prompt_of(int64_t group, int64_t length) {
  std::vector<int64_t> p{ByteTokenizer::kBos};
  for (int64_t i = 1; i < length; ++i) p.push_back((group * 31 + i * 7) % 256);
  return p;
}

std::vector<GenerationRequest> requests(int n_groups, int64_t n_samples, double temperature, int64_t max_new,
                                        int64_t shared_prefix = 0) {
  std::vector<GenerationRequest> out;
  for (int g = 0; g < n_groups; ++g) {
    GenerationRequest r;
    r.group_index = g;
    r.prompt = prompt_of(g, 5 + (g * 7) % 13);
    if (shared_prefix > 0) {  // a common header, as a system prompt would be
      std::vector<int64_t> header = prompt_of(99, shared_prefix);
      r.prompt.insert(r.prompt.begin(), header.begin(), header.end());
    }
    r.n_samples = n_samples;
    r.params.temperature = temperature;
    r.params.max_new_tokens = max_new;
    r.params.stop_token_ids = {ByteTokenizer::kEos};
    r.seed = mix_seed(1234, 0, uint64_t(g));
    out.push_back(r);
  }
  return out;
}

std::vector<Sample> generate(const Transformer& m, EngineConfig cfg, const std::vector<GenerationRequest>& reqs,
                                      EngineStats* stats = nullptr) {
  Engine e(cfg, m);
  for (const auto& r : reqs) e.add_request(r);
  auto out = e.run_to_completion();
  EXPECT_EQ(e.n_free_blocks() + e.prefix_cache().n_nodes(), e.n_blocks()) << "KV blocks leaked";
  if (stats) *stats = e.stats();
  return out;
}

void expect_same_tokens(const std::vector<Sample>& a, const std::vector<Sample>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].group_index, b[i].group_index);
    EXPECT_EQ(a[i].index, b[i].index);
    EXPECT_EQ(a[i].response(), b[i].response()) << "group " << a[i].group_index << " sample " << a[i].index;
  }
}

TEST(Engine, GreedyEqualsANoCacheGreedyLoop) {
  Transformer m(model_config(), 3, at::kCPU);
  auto reqs = requests(6, 1, 0.0, 20);
  auto out = generate(m, EngineConfig{4, 4096, 8, 64, true}, reqs);
  ASSERT_EQ(out.size(), 6u);
  at::NoGradGuard no_grad;
  for (const auto& s : out) {
    std::vector<int64_t> tokens = reqs[s.group_index].prompt;
    std::vector<int64_t> response;
    while (int64_t(response.size()) < 20) {
      at::Tensor logits = m.forward_packed(at::tensor(tokens, at::kLong), {int64_t(tokens.size())});
      int64_t next = logits[-1].argmax().item<int64_t>();
      tokens.push_back(next);
      response.push_back(next);
      if (next == ByteTokenizer::kEos) break;
    }
    EXPECT_EQ(s.response(), response) << "group " << s.group_index;
    EXPECT_EQ(s.status, response.back() == ByteTokenizer::kEos ? SampleStatus::Completed : SampleStatus::Truncated);
  }
}

TEST(Engine, AGroupPrefillsItsPromptOnce) {
  Transformer m(model_config(), 3, at::kCPU);
  auto reqs = requests(1, 8, 1.0, 12);
  EngineStats stats;
  auto out = generate(m, EngineConfig{4, 4096, 16, 256, false}, reqs, &stats);
  ASSERT_EQ(out.size(), 8u);
  EXPECT_EQ(stats.prefill_tokens_computed, int64_t(reqs[0].prompt.size()));
  EXPECT_EQ(stats.prompt_tokens_served, 8 * int64_t(reqs[0].prompt.size()));
  std::set<std::vector<int64_t>> distinct;
  for (const auto& s : out) distinct.insert(s.response());
  EXPECT_GT(distinct.size(), 4u);  // the samples differ: each has its own stream
}

TEST(Engine, SeededSamplesDoNotDependOnBatchSizeOrPrefixCache) {
  Transformer m(model_config(), 4, at::kCPU);
  auto reqs = requests(10, 4, 1.0, 24, /*shared_prefix=*/9);
  auto wide = generate(m, EngineConfig{4, 8192, 64, 512, true}, reqs);
  auto narrow = generate(m, EngineConfig{4, 8192, 4, 4, false}, reqs);  // one group at a time, tiny batches
  expect_same_tokens(wide, narrow);
  ASSERT_EQ(wide.size(), 40u);
  for (size_t i = 0; i < wide.size(); ++i)
    for (size_t t = 0; t < wide[i].rollout_log_probs.size(); ++t)
      EXPECT_NEAR(wide[i].rollout_log_probs[t], narrow[i].rollout_log_probs[t], 1e-5);
}

TEST(Engine, SeededSamplesAreTheSameAtMaxBatchOneAndSixtyFour) {
  Transformer m(model_config(), 8, at::kCPU);
  auto reqs = requests(64, 1, 1.0, 16);
  auto one = generate(m, EngineConfig{4, 8192, 1, 16, true}, reqs);   // one sequence at a time
  auto many = generate(m, EngineConfig{4, 8192, 64, 2048, true}, reqs);
  expect_same_tokens(one, many);
}

TEST(Engine, HostAndTensorSamplersGiveTheSameSamples) {
  // The tensor sampler is what runs on a GPU; on CPU it must reproduce the host one:
  // tokens, supports and log-probs, with top-k/top-p and greedy groups mixed in a batch.
  Transformer m(model_config(), 5, at::kCPU);
  auto reqs = requests(8, 3, 1.0, 16);
  for (size_t g = 0; g < reqs.size(); ++g) {
    if (g % 4 == 1) reqs[g].params.top_k = 4;
    if (g % 4 == 2) reqs[g].params.top_p = 0.8;
    if (g % 4 == 3) reqs[g].params.temperature = 0.0;
  }
  EngineConfig host{4, 8192, 24, 256, true}, tensor = host;
  host.sampler = EngineConfig::Sampler::Host;
  tensor.sampler = EngineConfig::Sampler::Tensor;
  auto a = generate(m, host, reqs), b = generate(m, tensor, reqs);
  expect_same_tokens(a, b);
  ASSERT_EQ(a.size(), 24u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].sampling_support, b[i].sampling_support);
    EXPECT_EQ(a[i].rollout_log_probs, b[i].rollout_log_probs);
  }
}

TEST(Engine, OneEngineAcrossThreeWeightUpdatesEqualsAFreshEngineEachTime) {
  // The rollout side keeps one engine for the run: its KV pool and (within a weight
  // version) its prefix cache outlive a generation round; a weight update invalidates
  // the cache. Each round must give what a fresh engine gives on the same weights.
  Transformer m(model_config(), 6, at::kCPU);
  const EngineConfig cfg{4, 4096, 16, 256, true};
  Engine kept(cfg, m);
  at::Generator g = at::detail::createCPUGenerator(5);
  for (int64_t version = 1; version <= 3; ++version) {
    {
      at::NoGradGuard no_grad;
      m.flat_parameters().add_(at::randn(m.flat_parameters().sizes(), g) * 0.02);  // a "training step"
    }
    kept.on_weights_updated(version);
    auto reqs = requests(6, 3, 1.0, 12, /*shared_prefix=*/9);
    for (auto& r : reqs) r.seed = mix_seed(77, uint64_t(version), uint64_t(r.group_index));
    for (const auto& r : reqs) kept.add_request(r);
    auto from_kept = kept.run_to_completion();
    EXPECT_EQ(kept.n_free_blocks() + kept.prefix_cache().n_nodes(), kept.n_blocks()) << "KV blocks leaked";
    auto fresh = generate(m, cfg, reqs);
    expect_same_tokens(from_kept, fresh);
    for (size_t i = 0; i < fresh.size(); ++i) {
      EXPECT_EQ(from_kept[i].weight_version(), version);
      for (size_t t = 0; t < fresh[i].rollout_log_probs.size(); ++t)
        EXPECT_NEAR(from_kept[i].rollout_log_probs[t], fresh[i].rollout_log_probs[t], 1e-5);
    }
    // A second round on the same weights is served from the kept prefix cache.
    const int64_t hits_before = kept.stats().prefix_hit_tokens;
    for (const auto& r : reqs) kept.add_request(r);
    expect_same_tokens(kept.run_to_completion(), fresh);
    EXPECT_GT(kept.stats().prefix_hit_tokens, hits_before);
  }
  EXPECT_THROW(
      {
        kept.add_request(requests(1, 1, 1.0, 4)[0]);
        kept.on_weights_updated(9);  // a request in flight
      },
      Error);
}

// Steps `e` `n` times; returns what finished.
std::vector<Sample> step_n(Engine& e, int n) {
  std::vector<Sample> out;
  for (int i = 0; i < n && e.has_work(); ++i)
    for (auto& s : e.step()) out.push_back(std::move(s));
  return out;
}

std::vector<Sample> sorted(std::vector<Sample> v) {
  std::sort(v.begin(), v.end(),
            [](const auto& a, const auto& b) { return std::tie(a.group_index, a.index) < std::tie(b.group_index, b.index); });
  return v;
}

TEST(Engine, WorkTakenOutMidGenerationContinuesElsewhereWithTheSameTokens) {
  // train.async = "full" moves unfinished work between engines (requeue), out of an
  // engine and back (continue: the KV is recomputed) and through checkpoints. On the
  // same weights the result is the uninterrupted generation's, whenever it is taken out.
  Transformer m(model_config(), 8, at::kCPU);
  const EngineConfig cfg{4, 4096, 16, 256, true};
  auto reqs = requests(6, 3, 1.0, 14, /*shared_prefix=*/5);
  const std::vector<Sample> straight = generate(m, cfg, reqs);
  for (int cut : {1, 2, 5, 9}) {
    Engine first(cfg, m);
    for (const auto& r : reqs) first.add_request(r);
    std::vector<Sample> out = step_n(first, cut);
    std::vector<WorkItem> items = first.take_in_flight();
    EXPECT_FALSE(first.has_work());
    EXPECT_EQ(first.n_free_blocks() + first.prefix_cache().n_nodes(), first.n_blocks()) << "KV blocks leaked";
    int64_t groups = 0, partial_tokens = 0;
    for (const auto& w : items) {
      groups += w.is_group();
      partial_tokens += w.response_length();
    }
    if (cut >= 5) EXPECT_GT(partial_tokens, 0) << "cut " << cut;  // some responses were under way
    EXPECT_GT(int64_t(items.size()), groups) << "cut " << cut;
    Engine second(cfg, m);
    for (const auto& w : items) second.add_work(w);
    for (auto& s : second.run_to_completion()) out.push_back(std::move(s));
    out = sorted(std::move(out));
    expect_same_tokens(out, straight);
    for (size_t i = 0; i < out.size(); ++i)
      for (size_t t = 0; t < out[i].rollout_log_probs.size(); ++t)
        EXPECT_NEAR(out[i].rollout_log_probs[t], straight[i].rollout_log_probs[t], 1e-5);
  }
}

TEST(Engine, ContinuedWorkKeepsItsOldTokensAndVersionsUnderNewWeights) {
  Transformer m(model_config(), 9, at::kCPU);
  const EngineConfig cfg{4, 4096, 16, 256, true};
  auto reqs = requests(4, 2, 1.0, 16);
  Engine e(cfg, m);
  for (const auto& r : reqs) e.add_request(r);
  std::vector<Sample> early = step_n(e, 6);
  std::vector<WorkItem> items = e.take_in_flight();
  {
    at::NoGradGuard no_grad;
    at::Generator g = at::detail::createCPUGenerator(3);
    m.flat_parameters().add_(at::randn(m.flat_parameters().sizes(), g) * 0.05);
  }
  e.on_weights_updated(1);
  for (const auto& w : items) e.add_work(w);
  std::vector<Sample> late = e.run_to_completion();
  int64_t spanning = 0;
  for (const auto& s : late) {
    const WorkItem* before = nullptr;
    for (const auto& w : items)
      if (!w.is_group() && w.partial.group_index == s.group_index && w.partial.index == s.index) before = &w;
    if (!before) {  // started after the update: all version 1
      for (int64_t v : s.weight_versions) EXPECT_EQ(v, 1);
      continue;
    }
    const int64_t r = before->response_length();
    ASSERT_GE(s.response_length(), r);
    EXPECT_TRUE(std::equal(before->partial.tokens.begin(), before->partial.tokens.end(), s.tokens.begin()));
    for (int64_t t = 0; t < s.response_length(); ++t) {
      EXPECT_EQ(s.weight_versions[t], t < r ? 0 : 1) << "token " << t;
      if (t < r) EXPECT_EQ(s.rollout_log_probs[t], before->partial.rollout_log_probs[t]);
    }
    spanning += r > 0 && s.response_length() > r;
  }
  EXPECT_GT(spanning, 0);
  // Refused: a partial response that does not continue its own request.
  WorkItem bad = items.back();
  bad.partial.tokens = {ByteTokenizer::kBos, 1, 2, 3};
  bad.partial.prompt_length = 2;
  EXPECT_THROW(e.add_work(bad), Error);
}

TEST(Engine, PrefixCacheServesASharedHeaderAcrossGroups) {
  Transformer m(model_config(), 4, at::kCPU);
  auto reqs = requests(8, 2, 1.0, 8, /*shared_prefix=*/24);
  EngineStats on, off;
  auto a = generate(m, EngineConfig{4, 8192, 2, 512, true}, reqs, &on);  // groups one after another
  auto b = generate(m, EngineConfig{4, 8192, 2, 512, false}, reqs, &off);
  expect_same_tokens(a, b);
  EXPECT_GE(on.prefix_hit_tokens, 7 * 24);  // every group after the first finds the header
  EXPECT_LE(on.prefill_tokens_computed, off.prefill_tokens_computed - 7 * 24);
}

// rollout.chunked_prefill_tokens: no forward prefills more than the bound (summed over
// its chunks), decoding sequences keep decoding while a long prompt is prefilled over
// several iterations, and the samples are those of an unbounded engine.
TEST(Engine, ChunkedPrefillBoundsEachForwardAndKeepsTheTokens) {
  Transformer m(testing::tiny_model_config(256, 0.2), 6, at::kCPU);
  std::vector<GenerationRequest> reqs = requests(6, 2, 1.0, 24);
  for (size_t g = 0; g < reqs.size(); ++g)  // long prompts: 40..140 tokens
    reqs[g].prompt = prompt_of(int64_t(g), 40 + 20 * int64_t(g));
  const std::vector<Sample> unbounded = generate(m, EngineConfig{4, 8192, 8, 512, true}, reqs);
  EngineConfig cfg{4, 8192, 8, 512, true};
  cfg.chunked_prefill_tokens = 24;
  Engine e(cfg, m);
  for (const auto& r : reqs) e.add_request(r);
  std::vector<Sample> chunked;
  int64_t iterations_with_both = 0;
  while (e.has_work()) {
    const EngineStats before = e.stats();
    const int64_t decoding = e.n_running();
    for (auto& s : e.step()) chunked.push_back(std::move(s));
    const EngineStats d = e.stats() - before;
    EXPECT_LE(d.prefill_tokens_computed, 24) << "iteration " << e.stats().iterations;
    if (d.prefill_tokens_computed > 0 && d.forward_tokens > d.prefill_tokens_computed && decoding > 0)
      ++iterations_with_both;
  }
  std::sort(chunked.begin(), chunked.end(),
            [](const auto& a, const auto& b) { return std::tie(a.group_index, a.index) < std::tie(b.group_index, b.index); });
  expect_same_tokens(unbounded, chunked);
  EXPECT_GT(iterations_with_both, 0) << "no prefill chunk ran next to decode rows";
  EXPECT_EQ(e.n_free_blocks() + e.prefix_cache().n_nodes(), e.n_blocks()) << "KV blocks leaked";
}

// rollout.cache_responses: a second turn whose prompt is the first turn's prompt +
// response + a new message finds the response's full blocks in the prefix cache, and
// samples exactly what an engine without response caching samples.
TEST(Engine, CachedResponsesServeTheNextTurnOfAConversation) {
  Transformer m(model_config(), 8, at::kCPU);
  const int64_t bs = 4;
  std::vector<GenerationRequest> turn1 = requests(2, 1, 1.0, 30);
  for (auto& r : turn1) r.params.stop_token_ids.clear();  // every response is 30 tokens
  for (bool cache_responses : {false, true}) {
    SCOPED_TRACE(cache_responses ? "responses cached" : "prompts only");
    EngineConfig cfg{bs, 8192, 4, 512, true};
    cfg.cache_responses = cache_responses;
    Engine e(cfg, m);
    for (const auto& r : turn1) e.add_request(r);
    const std::vector<Sample> first = e.run_to_completion();
    ASSERT_EQ(first.size(), 2u);
    std::vector<GenerationRequest> turn2;
    int64_t conversation_tokens = 0;  // first-turn tokens whose KV exists (all but the last)
    for (const Sample& s : first) {
      GenerationRequest r = turn1[s.group_index];
      r.group_index += 10;
      r.prompt = s.tokens;
      for (int64_t t : prompt_of(7, 9)) r.prompt.push_back(t);  // the user's next message
      turn2.push_back(r);
      conversation_tokens += (int64_t(s.tokens.size()) - 1) / bs * bs;
    }
    const EngineStats before = e.stats();
    for (const auto& r : turn2) e.add_request(r);
    const std::vector<Sample> second = e.run_to_completion();
    const EngineStats d = e.stats() - before;
    const std::vector<Sample> fresh = generate(m, EngineConfig{bs, 8192, 4, 512, false}, turn2);
    expect_same_tokens(fresh, second);
    if (cache_responses)
      EXPECT_EQ(d.prefix_hit_tokens, conversation_tokens);
    else
      EXPECT_LT(d.prefix_hit_tokens, conversation_tokens / 2);  // only the first turn's prompts
  }
}

// The prefix-cache counters take every admission: an episode's next turn (its sample so far
// and an observation, continued as the same sample) queries its whole context and finds the
// first turn's full blocks, as a new request with that prompt would.
TEST(Engine, PrefixCacheCountersTakeAnEpisodesNextTurn) {
  Transformer m(model_config(), 8, at::kCPU);
  const int64_t bs = 4;
  std::vector<GenerationRequest> turn1 = requests(1, 1, 1.0, 30);
  turn1[0].params.stop_token_ids.clear();  // a response of 30 tokens
  EngineConfig cfg{bs, 8192, 4, 512, true};
  cfg.cache_responses = true;
  Engine e(cfg, m);
  e.add_request(turn1[0]);
  const std::vector<Sample> first = e.run_to_completion();
  ASSERT_EQ(first.size(), 1u);
  WorkItem next;
  next.request = turn1[0];
  next.request.params.max_new_tokens = 60;
  next.partial = first[0];
  Sample& part = next.partial;
  for (int64_t t : prompt_of(7, 9)) {  // the observation, as an episode appends it (log-prob 0)
    part.tokens.push_back(t);
    part.rollout_log_probs.push_back(0.0f);
    part.weight_versions.push_back(part.weight_versions.back());
  }
  part.sampling_support.clear();
  const EngineStats before = e.stats();
  e.add_work(next);
  e.run_to_completion();
  const EngineStats d = e.stats() - before;
  EXPECT_EQ(d.prefix_query_tokens, int64_t(part.tokens.size()));
  EXPECT_EQ(d.prefix_hit_tokens, (int64_t(first[0].tokens.size()) - 1) / bs * bs);
}

TEST(Engine, PreemptionUnderATinyKvBudgetKeepsEveryToken) {
  Transformer m(model_config(), 5, at::kCPU);
  auto reqs = requests(6, 3, 1.0, 40);
  EngineStats roomy_stats, tight_stats;
  auto roomy = generate(m, EngineConfig{4, 8192, 32, 512, true}, reqs, &roomy_stats);
  auto tight = generate(m, EngineConfig{4, 4 * 16, 32, 512, true}, reqs, &tight_stats);  // 16 blocks of 4
  EXPECT_EQ(roomy_stats.preemptions, 0);
  EXPECT_GT(tight_stats.preemptions, 0);
  expect_same_tokens(roomy, tight);
  for (size_t i = 0; i < roomy.size(); ++i)
    for (size_t t = 0; t < roomy[i].rollout_log_probs.size(); ++t) EXPECT_NEAR(roomy[i].rollout_log_probs[t], tight[i].rollout_log_probs[t], 1e-5);
}

TEST(Engine, StopStringsAndMaxTokens) {
  Transformer m(model_config(), 6, at::kCPU);
  auto reqs = requests(4, 2, 1.0, 30);
  auto free_run = generate(m, EngineConfig{}, reqs);
  // Stop on a string that the free run produced: every sample that contains it ends there.
  ByteTokenizer tok;
  std::string text = tok.decode(free_run[0].response());
  ASSERT_GE(text.size(), 3u);
  std::string stop = text.substr(1, 2);
  for (auto& r : reqs) r.params.stop_strings = {stop};
  auto stopped = generate(m, EngineConfig{}, reqs);
  int n_stopped = 0;
  for (size_t i = 0; i < stopped.size(); ++i) {
    std::string s = tok.decode(stopped[i].response());
    size_t at = s.find(stop);
    if (at != std::string::npos) {
      EXPECT_EQ(at + stop.size(), s.size()) << "continued past the stop string";
      EXPECT_EQ(stopped[i].status, SampleStatus::Completed);
      ++n_stopped;
    }
    // up to the stop, the same tokens as the free run (same stream)
    const std::vector<int64_t> stopped_response = stopped[i].response(), free_response = free_run[i].response();
    EXPECT_TRUE(std::equal(stopped_response.begin(), stopped_response.end(), free_response.begin()));
  }
  EXPECT_GE(n_stopped, 1);
  for (auto& r : reqs) {
    r.params.stop_strings.clear();
    r.params.stop_token_ids.clear();
    r.params.max_new_tokens = 7;
  }
  for (const auto& s : generate(m, EngineConfig{}, reqs)) {
    EXPECT_EQ(s.response().size(), 7u);
    EXPECT_EQ(s.status, SampleStatus::Truncated);
  }
}

TEST(Engine, LogProbsEqualTheTrainersRecomputation) {
  Transformer m(model_config(), 7, at::kCPU);
  auto reqs = requests(8, 3, 0.8, 30, /*shared_prefix=*/6);
  auto out = generate(m, EngineConfig{4, 4 * 24, 32, 64, true}, reqs);  // preemptions, prefixes, chunked prefill
  const at::Tensor diff = testing::trainer_engine_logp_gap(m, out, 0.8);
  EXPECT_LT(diff.max().item<float>(), 1e-5);
  EXPECT_LT(diff.mean().item<float>(), 2e-6);
}

// Two engines' greedy generations of the same requests, a reference and a candidate that
// computes slightly other numbers (FP8 weights, an FP8 KV cache). Their tokens are the
// same wherever the reference's top-2 logit margin exceeds twice the largest logit change
// the candidate makes on that sequence (no flip is possible there): every divergence is
// checked to be where it is not. The candidate's log-probs are compared with the fp32
// masters' recomputation (what train/train_rollout_logprob_abs_diff measures).
using LogitsOf = std::function<at::Tensor(const at::Tensor& tokens)>;  // [L] -> [L, V] fp32
struct GreedyComparison {
  int same = 0, explained = 0;
  double worst_logit_change = 0, logp_mean = 0, logp_max = 0;
};
GreedyComparison compare_greedy(const std::vector<Sample>& a, const std::vector<Sample>& b, const LogitsOf& reference,
                                const LogitsOf& candidate, const Transformer& masters) {
  GreedyComparison c;
  EXPECT_EQ(a.size(), b.size());
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const at::Tensor t = at::tensor(a[i].tokens, at::kLong);
    const at::Tensor la = reference(t), lb = candidate(t);
    const double change = (la - lb).abs().max().item<double>();
    c.worst_logit_change = std::max(c.worst_logit_change, change);
    if (a[i].response() == b[i].response()) {
      ++c.same;
      continue;
    }
    size_t d = 0;  // first differing response position
    while (d < a[i].response().size() && d < b[i].response().size() && a[i].response()[d] == b[i].response()[d]) ++d;
    EXPECT_LT(d, std::min(a[i].response().size(), b[i].response().size())) << "one response is a prefix of the other";
    const at::Tensor top = std::get<0>(la[a[i].prompt_length + int64_t(d) - 1].topk(2));
    const double margin = (top[0] - top[1]).item<double>();
    EXPECT_LT(margin, 2 * change) << "group " << i << " diverged at " << d << " where the reference's margin "
                                  << margin << " exceeds twice the candidate's logit change " << change;
    ++c.explained;
  }
  const at::Tensor diff = testing::trainer_engine_logp_gap(masters, b, 1.0);
  c.logp_mean = diff.mean().item<double>();
  c.logp_max = diff.max().item<double>();
  std::printf("%d of %zu greedy sequences the same, %d diverged where margins allow; largest logit change %.4f; "
              "|logp - masters'| mean %.2e max %.2e\n", c.same, a.size(), c.explained, c.worst_logit_change,
              c.logp_mean, c.logp_max);
  return c;
}

// rollout.precision = "fp8" (sync/fp8_weights.h): an engine on the FP8 round trip of
// the masters against a bf16 engine of the same masters. Bounds set from the measured
// values with room. A random model (init 0.05) has small margins: most sequences
// diverge somewhere, each where its margin allows.
TEST(Engine, Fp8EngineMatchesBf16WhereMarginsAllow) {
  // Also DeepSeek-V3's shape (latent attention, DeepSeekMoE): its latent projections and
  // experts go through e4m3 blocks, its router and correction bias through bf16.
  for (const bool deepseek : {false, true}) {
    SCOPED_TRACE(deepseek ? "DeepSeek-V3's shape" : "dense");
    ModelConfig cfg = testing::tiny_model_config(96, 0.05);  // measured: 4 of 16 sequences the same
    if (deepseek) {
      cfg.n_experts = 4;
      cfg.n_experts_per_tok = 2;
      cfg.moe_intermediate_size = 32;
      testing::use_deepseek_moe(cfg, /*n_group=*/2, /*topk_group=*/1, /*first_k_dense=*/1);
      testing::use_latent_attention(cfg);
    }
    Transformer masters(cfg, 5, at::kCPU);
    Transformer bf16(cfg, 5, at::kCPU, at::kBFloat16), fp8(cfg, 5, at::kCPU, at::kBFloat16);
    bf16.copy_weights_from(masters);
    copy_through_fp8(masters, fp8);
    const auto reqs = requests(16, 1, 0.0, 24);
    const EngineConfig ec{4, 4096, 16, 256, true};
    auto packed = [](const Transformer& m) {
      return [&m](const at::Tensor& t) {
        ForwardPrecision bf(Precision::BF16, at::kCPU);
        return m.forward_packed(t, {t.size(0)});
      };
    };
    const GreedyComparison c = compare_greedy(generate(bf16, ec, reqs), generate(fp8, ec, reqs), packed(bf16),
                                              packed(fp8), masters);
    // Measured: dense 0.064 / 8.3e-3 / 5.5e-2 (bf16 engines: ~3e-4 mean on the smoke run);
    // DeepSeek-V3's shape 0.87 / 9.7e-3 / 0.28: where the e4m3 rounding flips a token's
    // experts the layer's output jumps (latent attention alone: 0.059 / 6.8e-3 / 2.8e-2).
    EXPECT_GT(c.worst_logit_change, 0.0) << "FP8 changed nothing";
    EXPECT_LT(c.worst_logit_change, deepseek ? 1.5 : 0.2);
    EXPECT_LT(c.logp_mean, 0.025);
    EXPECT_LT(c.logp_max, deepseek ? 0.5 : 0.2);
  }
}

// rollout.kv_cache_dtype = "fp8_e4m3" (model/kv_cache.h): a bf16 engine whose cache holds
// e4m3 against the same engine with a bf16 cache. The candidate's logits on a sequence:
// one prefill through an e4m3 cache (attention reads every key back de-quantised). An
// e4m3 token takes half a bf16 one's bytes. Also with multi-head latent attention, whose
// cache rows are the latent and the shared rotary key (absorbed decode over e4m3 rows).
TEST(Engine, Fp8KvCacheMatchesBf16CacheWhereMarginsAllow) {
  for (const bool mla : {false, true}) {
    SCOPED_TRACE(mla ? "latent attention" : "grouped-query attention");
    ModelConfig cfg = testing::tiny_model_config(96, 0.05);
    if (mla) testing::use_latent_attention(cfg);
    Transformer masters(cfg, 5, at::kCPU), bf16(cfg, 5, at::kCPU, at::kBFloat16);
    bf16.copy_weights_from(masters);
    const auto reqs = requests(16, 1, 0.0, 24);
    EngineConfig plain{4, 4096, 16, 256, true}, e4m3 = plain;
    e4m3.kv_cache_dtype = at::kFloat8_e4m3fn;
    auto through_cache = [&](at::ScalarType dtype) {
      return [&bf16, &cfg, dtype](const at::Tensor& t) {
        ForwardPrecision bf(Precision::BF16, at::kCPU);
        KvCache cache = KvCache::allocate(cfg, t.size(0), at::TensorOptions().dtype(dtype));
        return bf16.forward_incremental(t, {{0, t.size(0), at::arange(t.size(0), at::kLong)}}, cache);
      };
    };
    const GreedyComparison c = compare_greedy(generate(bf16, plain, reqs), generate(bf16, e4m3, reqs),
                                              through_cache(at::kBFloat16), through_cache(at::kFloat8_e4m3fn),
                                              masters);
    EXPECT_GT(c.worst_logit_change, 0.0) << "the e4m3 cache changed nothing";
    EXPECT_LT(c.worst_logit_change, 0.2);
    EXPECT_LT(c.logp_mean, 0.025);
    EXPECT_LT(c.logp_max, 0.2);
    const KvCache b = KvCache::allocate(cfg, 8, at::TensorOptions().dtype(at::kBFloat16)),
                  e = KvCache::allocate(cfg, 8, at::TensorOptions().dtype(at::kFloat8_e4m3fn)),
                  f = KvCache::allocate(cfg, 8, at::TensorOptions().dtype(at::kFloat));
    EXPECT_EQ(e.bytes_per_token() * 2, b.bytes_per_token());
    EXPECT_EQ(e.bytes_per_token() * 4, f.bytes_per_token());
    // Per layer a key row and a value row of GQA's heads × head_dim; MLA's one row of
    // kv_lora_rank + qk_rope_head_dim, its values read from its keys.
    if (mla) EXPECT_EQ(e.bytes_per_token(), cfg.n_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim));
    else EXPECT_EQ(e.bytes_per_token(), 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim());
  }
}

TEST(Engine, LongContextLogProbsAndTokensHoldAt4096Positions) {
  // Real lengths: 3072-token prompts + 1024-token responses fill a 4096-position model.
  // The engine (chunked prefill through max_batch_tokens, paged KV cache) and the
  // trainer's packed forward (unpadded attention at these lengths) agree on every
  // response log-prob; a tight cache with preemption and smaller chunks gives the same
  // tokens.
  Transformer m(testing::tiny_model_config(4096, 0.2), 9, at::kCPU);
  std::vector<GenerationRequest> reqs;
  for (int g = 0; g < 2; ++g) {
    GenerationRequest r;
    r.group_index = g;
    r.prompt = prompt_of(g, 3072);
    r.n_samples = 2;
    r.params.temperature = 1.0;
    r.params.max_new_tokens = 1024;  // no stop token: every response is 1024 tokens
    r.seed = mix_seed(4096, 0, uint64_t(g));
    reqs.push_back(r);
  }
  auto out = generate(m, EngineConfig{16, 4 * 4096, 4, 512, true}, reqs);
  ASSERT_EQ(out.size(), 4u);
  for (const auto& s : out) ASSERT_EQ(int64_t(s.tokens.size()), 4096);
  EXPECT_GT(4 * m.config().n_heads * 4096 * 4096, m.padded_attention_budget());  // the unpadded path
  const at::Tensor diff = testing::trainer_engine_logp_gap(m, out, 1.0);
  // The bar, |Δ| < 1e-5, at 4096 positions: measured 2.9e-6 at most (it was
  // 1.1e-5 before the paged kernel summed its softmax denominators in fp64 and V in tiles).
  // The mean depends on the CPU's BLAS kernels: 1.02e-6 on a Zen 5 EPYC (avx512_vp2intersect,
  // 2026-12-01), below 1e-6 on the Zen 4 before; bound at 2e-6.
  EXPECT_LT(diff.max().item<float>(), 1e-5);
  EXPECT_LT(diff.mean().item<float>(), 2e-6);
  // Preemption (a 390-block cache: both prompts fit, their responses do not) and 128-token
  // prefill chunks, first 128 response tokens (a token depends only on its position's
  // draw, not on max_new_tokens): the same tokens.
  for (auto& r : reqs) r.params.max_new_tokens = 128;
  EngineStats tight_stats;
  EngineConfig tight_cfg{16, 16 * 390, 4, 512, true};
  tight_cfg.chunked_prefill_tokens = 128;
  auto tight = generate(m, tight_cfg, reqs, &tight_stats);
  EXPECT_GT(tight_stats.preemptions, 0);
  ASSERT_EQ(tight.size(), out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const std::vector<int64_t> full = out[i].response(), part = tight[i].response();
    ASSERT_EQ(part.size(), 128u);
    EXPECT_TRUE(std::equal(part.begin(), part.end(), full.begin())) << "sample " << i;
  }
}

TEST(Engine, TopKTopPLogProbsAreOverTheSamplingSupport) {
  // slime's top-p-aware training: the engine's log-prob of a token drawn with top_k /
  // top_p is under the renormalised truncated distribution, recomputed here from the
  // model's own logits and the recorded support size alone.
  Transformer m(model_config(), 7, at::kCPU);
  auto reqs = requests(6, 3, 1.2, 12);
  for (auto& r : reqs) {
    r.params.top_k = 5;
    r.params.top_p = 0.9;
  }
  auto out = generate(m, EngineConfig{4, 4 * 64, 32, 64, true}, reqs);
  at::NoGradGuard no_grad;
  double worst = 0, full_gap = 0;
  for (const auto& s : out) {
    ASSERT_EQ(int64_t(s.sampling_support.size()), s.response_length());
    at::Tensor t = at::tensor(s.tokens, at::kLong);
    at::Tensor z = m.forward_packed(t, {int64_t(s.tokens.size())}) / 1.2;  // [T, V]
    for (int64_t j = 0; j < s.response_length(); ++j) {
      const int64_t k = s.sampling_support[j], pos = s.prompt_length + j;
      ASSERT_GE(k, 1);
      ASSERT_LE(k, 5);
      at::Tensor row = z[pos - 1];
      at::Tensor top = std::get<0>(row.topk(k));
      const double want = row[s.tokens[pos]].item<double>() - top.logsumexp(0).item<double>();
      worst = std::max(worst, std::abs(want - s.rollout_log_probs[j]));
      full_gap = std::max(full_gap, std::abs(row.log_softmax(0)[s.tokens[pos]].item<double>() - want));
    }
  }
  EXPECT_LT(worst, 1e-5);
  EXPECT_GT(full_gap, 0.05);  // the full-vocabulary log-prob would be a different number
}

TEST(Engine, RefusesWhatCanNeverFit) {
  Transformer m(model_config(), 1, at::kCPU);
  Engine e(EngineConfig{4, 32, 4, 64, true}, m);  // 8 blocks
  auto r = requests(1, 1, 1.0, 90)[0];
  EXPECT_THROW(e.add_request(r), Error);  // past max_seq_len
  r.params.max_new_tokens = 40;
  EXPECT_THROW(e.add_request(r), Error);  // needs more than 8 blocks
  r.params.max_new_tokens = 10;
  r.n_samples = 5;
  EXPECT_THROW(e.add_request(r), Error);  // more samples than max_running
}

}  // namespace
}  // namespace slimpi
