// The streaming router of train.async = "full", across ranks (np 1, 2 and 3: every
// rank an engine): generation paused again and again, new weight versions taken under
// each rollout.partial policy, a checkpoint snapshot restored into new engines and
// routers mid-run. On unchanged weights none of that may change a token: every group
// comes back once, whole, with the samples one engine gives uninterrupted. Where it
// pauses depends on timing; what it returns must not.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <slimpi/error.h>

#include <memory>
#include <set>

#include "kernels/counter_rng.h"
#include "parallel/mpi_bytes.h"
#include "rollout/streaming_router.h"
#include "tokenizer/byte_tokenizer.h"
#include "../support/tiny_model.h"

namespace slimpi {
namespace {

constexpr int kGroups = 16;

// Long prompts make messages of work (8 bytes a prompt token) and of samples larger
// than MPI's eager limit (4 KB in Open MPI's shared memory): such a send completes only
// once its receive is posted, both directions at once.
constexpr int kLongPrompt = 700;

SamplingParams params() {
  SamplingParams p;
  p.max_new_tokens = 24;
  p.stop_token_ids = {ByteTokenizer::kEos};
  return p;
}

GenerationRequest request(int g, bool long_prompt = false) {
  GenerationRequest r;
  r.group_index = g;
  r.prompt = {ByteTokenizer::kBos};
  for (int i = 0; i < (long_prompt ? kLongPrompt : 3) + g % 6; ++i) r.prompt.push_back((g * 17 + i * 3) % 256);
  r.n_samples = 3;
  r.params = params();
  r.seed = mix_seed(5, 1, uint64_t(g));
  return r;
}

struct Case {
  PartialPolicy policy;
  bool restart;              // snapshot at the second pause, then continue in new engines and routers
  bool long_prompts = false;  // kLongPrompt-token prompts
};

EngineConfig engine_config() { return EngineConfig{16, 32768, 6, 1024, true}; }

// Runs kGroups groups, pausing the k-th run after 2 + 2k router iterations (the router's
// own engine always holds work then, mid-generation; runs grow so that discard, which
// restarts every partial response at each update, still finishes); returns the
// router's groups, flattened, in group order.
std::vector<Sample> run_paused(const Transformer& model, const Case& c, int64_t* versions_seen) {
  const EngineConfig cfg = engine_config();
  auto engine = std::make_unique<Engine>(cfg, model);
  auto router = std::make_unique<StreamingRouter>(*engine, MPI_COMM_WORLD, cfg.max_running, params());
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<Sample> got;
  int next = 0, finished = 0, calls = 0;
  StreamingRouter::Hooks hooks;
  hooks.next_group = [&]() -> std::optional<WorkItem> {
    if (next >= kGroups) return std::nullopt;
    return WorkItem{request(next++, c.long_prompts), Sample{}};
  };
  hooks.on_group = [&](std::vector<Sample> g) {
    EXPECT_EQ(int64_t(g.size()), 3);
    for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(g[i].index, int64_t(i));
    for (auto& s : g) got.push_back(std::move(s));
    ++finished;
  };
  int64_t version = 0;
  for (int pause = 0;; ++pause) {
    int polls = 0;
    hooks.should_pause = [&] { return ++polls > 2 + 2 * pause; };
    ++calls;
    router->run(hooks);
    int all_done = rank == 0 && finished == kGroups;
    MPI_Bcast(&all_done, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (all_done) break;
    if (pause > 200) {  // work was lost: its group never comes back
      ADD_FAILURE() << "groups still missing after " << pause << " pauses";
      break;
    }
    router->update_weights(++version, c.policy);  // same weights, a new version number
    if (c.restart && pause == 1) {
      StreamState state = router->snapshot();
      router.reset();
      engine = std::make_unique<Engine>(cfg, model);  // as a resumed job builds them
      router = std::make_unique<StreamingRouter>(*engine, MPI_COMM_WORLD, cfg.max_running, params());
      if (rank == 0) router->restore(std::move(state));
    }
  }
  EXPECT_GT(calls, 3);
  std::set<int64_t> versions;
  for (const auto& s : got)
    for (int64_t v : s.weight_versions) versions.insert(v);
  *versions_seen = static_cast<int64_t>(versions.size());
  std::sort(got.begin(), got.end(),
            [](const auto& a, const auto& b) { return std::tie(a.group_index, a.index) < std::tie(b.group_index, b.index); });
  return got;
}

class StreamingRouterTest : public ::testing::TestWithParam<Case> {};

TEST_P(StreamingRouterTest, PausesUpdatesAndRestartsChangeNoToken) {
  Transformer model(testing::tiny_model_config(1024, 0.2), 13, at::kCPU);
  int64_t versions_seen = 0;
  std::vector<Sample> got = run_paused(model, GetParam(), &versions_seen);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    EXPECT_TRUE(got.empty());
    return;
  }
  Engine alone(engine_config(), model);
  for (int g = 0; g < kGroups; ++g) alone.add_request(request(g, GetParam().long_prompts));
  const std::vector<Sample> straight = alone.run_to_completion();
  ASSERT_EQ(got.size(), straight.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].group_index, straight[i].group_index);
    ASSERT_EQ(got[i].index, straight[i].index);
    EXPECT_EQ(got[i].tokens, straight[i].tokens) << "group " << got[i].group_index << " sample " << got[i].index;
    ASSERT_EQ(got[i].rollout_log_probs.size(), straight[i].rollout_log_probs.size());
    for (size_t t = 0; t < got[i].rollout_log_probs.size(); ++t)
      EXPECT_NEAR(got[i].rollout_log_probs[t], straight[i].rollout_log_probs[t], 1e-5);
  }
  EXPECT_GT(versions_seen, 1);  // generation went on across weight versions
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  static const char* const names[] = {"Continue", "Requeue", "Discard"};
  return std::string(names[int(info.param.policy)]) + (info.param.restart ? "AndRestart" : "") +
         (info.param.long_prompts ? "LongPrompts" : "");
}

INSTANTIATE_TEST_SUITE_P(Policies, StreamingRouterTest,
                         ::testing::Values(Case{PartialPolicy::Continue, false}, Case{PartialPolicy::Requeue, false},
                                           Case{PartialPolicy::Discard, false}, Case{PartialPolicy::Continue, true},
                                           Case{PartialPolicy::Requeue, true}, Case{PartialPolicy::Discard, true},
                                           Case{PartialPolicy::Continue, false, true},
                                           Case{PartialPolicy::Requeue, true, true}),
                         case_name);

TEST(StreamingRouter, DiscardRestartsPartialResponsesAndCountsTheirTokens) {
  // One rank's engine with work half done: discard throws the responses away (counted),
  // continue keeps them (counted), requeue moves them to the router's queue.
  Transformer model(testing::tiny_model_config(64, 0.2), 13, at::kCPU);
  const EngineConfig cfg = engine_config();
  for (PartialPolicy policy : {PartialPolicy::Continue, PartialPolicy::Requeue, PartialPolicy::Discard}) {
    Engine engine(cfg, model);
    StreamingRouter router(engine, MPI_COMM_SELF, cfg.max_running, params());
    int next = 0, steps = 0;
    StreamingRouter::Hooks hooks;
    hooks.next_group = [&]() -> std::optional<WorkItem> {
      if (next >= 2) return std::nullopt;
      return WorkItem{request(next++), Sample{}};
    };
    hooks.on_group = [](std::vector<Sample>) {};
    hooks.should_pause = [&] { return ++steps > 4; };  // 4 engine iterations: prompts done, responses begun
    router.run(hooks);
    int64_t in_flight_tokens = 0, partials = 0;
    for (const auto& w : engine.in_flight()) {
      in_flight_tokens += w.response_length();
      partials += !w.is_group();
    }
    ASSERT_GT(in_flight_tokens, 0);
    const PartialStats p = router.update_weights(1, policy);
    EXPECT_EQ(p.continued, policy == PartialPolicy::Continue ? partials : 0);
    EXPECT_EQ(p.requeued, policy == PartialPolicy::Requeue ? partials : 0);
    EXPECT_EQ(p.discarded, policy == PartialPolicy::Discard ? partials : 0);
    EXPECT_EQ(p.discarded_tokens, policy == PartialPolicy::Discard ? in_flight_tokens : 0);
    const StreamState s = router.snapshot();
    int64_t kept_tokens = 0;
    for (const auto& w : s.work) kept_tokens += w.response_length();
    EXPECT_EQ(kept_tokens, policy == PartialPolicy::Discard ? 0 : in_flight_tokens);
    EXPECT_EQ(router.open_groups(), 2);
  }
}

}  // namespace
}  // namespace slimpi
