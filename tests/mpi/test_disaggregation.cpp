// Prefill/decode disaggregation across ranks (rollout/disaggregated_router.h), at np 3
// and 4 with 1 or 2 prefill engines: every group comes back once, with exactly the
// samples of one plain engine (tokens, log-probs, MoE routing traces), whatever engine
// prefilled or decoded it; prefill ranks sample nothing and hand over every prompt
// position but the last; decode dispatch holds to 2·max_running outstanding sequences
// (more groups than that), so the router hands out work as groups come back.
// Episodes (rollout.environment) under disaggregation (rollout/disaggregated_episodes.h),
// with 1 to n - 1 prefill engines: every episode comes back as one plain engine and runner
// give it, with one context or split in two; the decode engines took in the rows of
// exactly the turns that open a context (every turn without a prefix cache), every
// position of them but the last, and a sequence already away was not sent again (a
// group's samples opening the same context share one prefill).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "kernels/counter_rng.h"
#include "rollout/disaggregated_router.h"
#include "rollout/episode_runner.h"
#include "tokenizer/byte_tokenizer.h"
#include "../support/three_turn_environment.h"
#include "../support/tiny_model.h"
#include "../support/mpi_world.h"

namespace slimpi {
namespace {

using testing::world_rank;
using testing::world_size;

ModelConfig model_config() {
  ModelConfig c = testing::tiny_model_config(96, 0.3);
  c.n_experts = 4;
  c.n_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.moe_layer_freq = 2;  // layer 1 is sparse
  return c;
}

std::vector<GenerationRequest> requests() {
  std::vector<GenerationRequest> out;
  for (int g = 0; g < 20; ++g) {
    GenerationRequest r;
    r.group_index = g;
    r.prompt = {ByteTokenizer::kBos};
    for (int i = 0; i < 8; ++i) r.prompt.push_back(40 + i);  // a shared header
    for (int i = 0; i < (g * 5) % 23; ++i) r.prompt.push_back((g * 31 + i * 7) % 256);
    r.n_samples = 3;
    r.params.temperature = 1.0;
    r.params.max_new_tokens = 4 + (g * 7) % 20;  // uneven lengths: dispatch matters
    r.params.stop_token_ids = {ByteTokenizer::kEos};
    r.seed = mix_seed(99, 0, uint64_t(g));
    out.push_back(r);
  }
  return out;
}

TEST(Disaggregation, EveryGroupOnceWithOnePlainEnginesSamples) {
  const int n = world_size();
  Transformer model(model_config(), 13, at::kCPU);
  const EngineConfig cfg{4, 4096, 6, 128, true};  // 2·6 outstanding sequences an engine: 4 groups
  Engine alone(cfg, model);
  for (const auto& r : requests()) alone.add_request(r);
  const std::vector<Sample> single = alone.run_to_completion();
  ASSERT_EQ(single.size(), 60u);
  for (int64_t n_prefill = 1; n_prefill <= n - 2; ++n_prefill) {
    SCOPED_TRACE(::testing::Message() << n_prefill << " prefill engine(s) of " << n);
    EngineConfig mine = cfg;
    mine.prefill_only = is_prefill_rank(world_rank(), n, n_prefill);
    Engine engine(mine, model);
    EngineStats pd;
    const std::vector<Sample> routed =
        route_disaggregated(engine, MPI_COMM_WORLD, n_prefill, cfg.max_running, requests(), {}, pd);
    EngineStats st = engine.stats();
    st += pd;
    if (mine.prefill_only) {
      EXPECT_EQ(st.generated_tokens, 0);
      EXPECT_GT(st.kv_sent_tokens, 0) << "a prefill engine got no prompt";
      EXPECT_GT(st.prefill_wall_s, 0.0);
    } else {
      EXPECT_EQ(st.kv_sent_tokens, 0);
      EXPECT_GT(st.decode_wall_s, 0.0);
    }
    int64_t handed = 0;
    for (const auto& r : requests()) handed += int64_t(r.prompt.size()) - 1;
    const EngineStats sum = sum_engine_stats(st, MPI_COMM_WORLD);
    EXPECT_EQ(sum.kv_sent_tokens, handed);
    EXPECT_EQ(sum.kv_received_tokens, handed);
    EXPECT_EQ(sum.kv_sent_bytes, sum.kv_received_bytes);
    if (world_rank() != 0) {
      EXPECT_TRUE(routed.empty());
      continue;
    }
    ASSERT_EQ(routed.size(), single.size());
    for (size_t i = 0; i < routed.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "group " << i / 3 << " sample " << i % 3);
      EXPECT_EQ(routed[i].group_index, int64_t(i / 3));
      EXPECT_EQ(routed[i].index, int64_t(i % 3));
      EXPECT_EQ(routed[i].tokens, single[i].tokens);
      EXPECT_EQ(routed[i].routing, single[i].routing);
      ASSERT_EQ(routed[i].rollout_log_probs.size(), single[i].rollout_log_probs.size());
      for (size_t t = 0; t < routed[i].rollout_log_probs.size(); ++t)
        EXPECT_NEAR(routed[i].rollout_log_probs[t], single[i].rollout_log_probs[t],
                    1e-5 * std::max(1.0f, std::abs(single[i].rollout_log_probs[t])));  // fp32 round-off
    }
  }
}

EpisodeSettings episode_settings() {
  EpisodeSettings s;
  s.env.name = "three_turns";
  s.env.max_total_tokens = 120;  // 3 turns of up to 20 tokens and 2 observations of ~16
  s.max_turn_tokens = 20;
  return s;
}

std::vector<GenerationRequest> episode_requests() {
  std::vector<GenerationRequest> out;
  for (int g = 0; g < 10; ++g) {
    GenerationRequest r;
    r.group_index = g;
    r.prompt = {ByteTokenizer::kBos};
    for (int i = 0; i < 3 + (g * 5) % 11; ++i) r.prompt.push_back((g * 31 + i * 7) % 256);
    r.n_samples = 3;
    r.params.temperature = 1.0;
    r.params.max_new_tokens = 20;
    r.params.stop_token_ids = {ByteTokenizer::kEos};
    r.seed = mix_seed(77, 0, uint64_t(g));
    out.push_back(r);
  }
  return out;
}

// The sequences a finished episode's turns sent to the prefill engines: per such turn
// (every turn, or a context's first) its sequence, the first context's beginning with the
// prompt, a later one's at its own start. Turns are told apart by the observations between
// them (ThreeTurnEnvironment's are never empty).
std::vector<std::vector<int64_t>> prefilled_sequences(const Sample& s, bool every_turn) {
  const auto& mask = s.loss_mask;
  std::vector<std::vector<int64_t>> out;
  for (int64_t t = 0; t < int64_t(mask.size()); ++t) {
    if (mask[size_t(t)] == 0.0f || (t > 0 && mask[size_t(t - 1)] != 0.0f)) continue;  // t: a turn's first token
    int64_t c = -1;  // its context's start (-1: the first context)
    for (int64_t start : s.context_starts)
      if (start <= t) c = start;
    const bool opens = std::all_of(mask.begin() + std::max<int64_t>(c, 0), mask.begin() + t,
                                   [](float m) { return m == 0.0f; });
    if (every_turn || opens)
      out.emplace_back(s.tokens.begin() + (c < 0 ? 0 : s.prompt_length + c), s.tokens.begin() + s.prompt_length + t);
  }
  return out;
}

// Without a prefix cache (as a hybrid model's engines run) every turn is prefilled by the
// prefill engines, not only a context's first.
TEST(DisaggregatedEpisodes, EveryEpisodeAsOnePlainEngineRunsIt) {
  const int n = world_size();
  Transformer model(testing::tiny_model_config(1024, 0.2), 13, at::kCPU);
  ByteTokenizer tokenizer;
  std::vector<Prompt> records;
  for (int g = 0; g < 10; ++g) records.push_back({g, g + 1, "prompt " + std::to_string(g)});
  for (auto [new_context_at, prefix_cache] : {std::pair{0, true}, {1, true}, {1, false}}) {
    SCOPED_TRACE(::testing::Message() << (new_context_at ? "a new context after turn 1" : "one context")
                                      << (prefix_cache ? "" : ", no prefix cache"));
    EngineConfig cfg{4, 8192, 6, 256, prefix_cache};  // 2·6 outstanding sequences an engine: 4 groups
    cfg.cache_responses = prefix_cache;                // (as rollout.environment sets it)
    Engine alone(cfg, model);
    testing::ThreeTurnEnvironment alone_env(true, "", false, new_context_at);
    EpisodeRunner alone_runner(alone, alone_env, tokenizer, episode_settings(), records, 0);
    for (const auto& r : episode_requests()) alone_runner.add_request(r);
    std::vector<Sample> single;
    while (alone_runner.has_work())
      for (Sample& s : alone_runner.step()) single.push_back(std::move(s));
    sort_by_group_and_sample(single);
    ASSERT_EQ(single.size(), 30u);
    int64_t handed = 0, distinct = 0;  // positions of every prefilled turn; of each sequence once
    std::set<std::vector<int64_t>> seen;
    for (const Sample& s : single)
      for (const auto& sequence : prefilled_sequences(s, /*every_turn=*/!prefix_cache)) {
        handed += int64_t(sequence.size()) - 1;
        if (seen.insert(sequence).second) distinct += int64_t(sequence.size()) - 1;
      }

    for (int64_t n_prefill = 1; n_prefill <= n - 1; ++n_prefill) {  // (n - 1: rank 0 decodes alone)
      SCOPED_TRACE(::testing::Message() << n_prefill << " prefill engine(s) of " << n);
      Engine engine(engine_config_of_rank(cfg, world_rank(), n, n_prefill), model);
      std::unique_ptr<testing::ThreeTurnEnvironment> env;
      std::unique_ptr<EpisodeRunner> runner;
      if (!engine.is_prefill_engine()) {
        env = std::make_unique<testing::ThreeTurnEnvironment>(true, "", false, new_context_at);
        runner = std::make_unique<EpisodeRunner>(engine, *env, tokenizer, episode_settings(), records, 0);
      }
      EngineStats pd;
      const std::vector<Sample> routed = route_groups(engine, runner.get(), /*episodic=*/true, MPI_COMM_WORLD,
                                                      n_prefill, cfg.max_running, episode_requests(), {}, pd);
      EngineStats st = engine.stats();
      st += pd;
      if (engine.is_prefill_engine()) {
        EXPECT_EQ(st.generated_tokens, 0);
        EXPECT_GT(st.kv_sent_tokens, 0) << "a prefill engine got no context";
      } else {
        EXPECT_EQ(st.kv_sent_tokens, 0);
        EXPECT_GT(st.decode_wall_s, 0.0);
      }
      const EngineStats sum = sum_engine_stats(st, MPI_COMM_WORLD);
      // Every such turn took its rows in; a sequence away already on its decode engine was
      // not sent again. A group's resets reach its runner together (ThreeTurnEnvironment
      // answers them in one poll), so with one context each group's samples share one prefill.
      EXPECT_EQ(sum.kv_received_tokens, handed);
      EXPECT_GE(sum.kv_sent_tokens, distinct);
      EXPECT_LE(sum.kv_sent_tokens, handed);
      if (new_context_at == 0 && prefix_cache) EXPECT_EQ(sum.kv_sent_tokens, distinct);
      EXPECT_LT(distinct, handed);
      EXPECT_EQ(sum.kv_sent_bytes * sum.kv_received_tokens, sum.kv_received_bytes * sum.kv_sent_tokens)
          << "rows of another size a position";
      if (world_rank() != 0) {
        EXPECT_TRUE(routed.empty());
        continue;
      }
      ASSERT_EQ(routed.size(), single.size());
      for (size_t i = 0; i < routed.size(); ++i) {
        SCOPED_TRACE(::testing::Message() << "group " << i / 3 << " sample " << i % 3);
        EXPECT_EQ(routed[i].group_index, single[i].group_index);
        EXPECT_EQ(routed[i].index, single[i].index);
        EXPECT_EQ(routed[i].status, single[i].status);
        EXPECT_EQ(routed[i].env_turns, 3);
        EXPECT_EQ(routed[i].env_turns, single[i].env_turns);
        EXPECT_EQ(routed[i].raw_reward, single[i].raw_reward);
        EXPECT_EQ(routed[i].tokens, single[i].tokens);
        EXPECT_EQ(routed[i].loss_mask, single[i].loss_mask);
        EXPECT_EQ(routed[i].context_starts, single[i].context_starts);
        EXPECT_EQ(routed[i].context_starts.size(), size_t(new_context_at));
        ASSERT_EQ(routed[i].rollout_log_probs.size(), single[i].rollout_log_probs.size());
        for (size_t t = 0; t < routed[i].rollout_log_probs.size(); ++t)
          EXPECT_NEAR(routed[i].rollout_log_probs[t], single[i].rollout_log_probs[t],
                      1e-5 * std::max(1.0f, std::abs(single[i].rollout_log_probs[t])));  // fp32 round-off
      }
    }
  }
}

}  // namespace
}  // namespace slimpi
