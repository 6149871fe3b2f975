// The streaming router of train.async = "full", across ranks (np 1, 2 and 3: every
// rank an engine): generation paused again and again, new weight versions taken under
// each rollout.partial policy, a checkpoint snapshot restored into new engines and
// routers mid-run. On unchanged weights none of that may change a token: every group
// comes back once, whole, with the samples one engine gives uninterrupted. Where it
// pauses depends on timing; what it returns must not. The same holds for multi-turn
// episodes (rollout.environment): their turns continue across updates, and a snapshot
// restored into new engines, runners and environments replays each episode's turns
// into its new environment and continues it, token for token (or, with an environment
// that is not deterministic, starts it again from its reset).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <slimpi/error.h>

#include <deque>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "kernels/counter_rng.h"
#include "parallel/mpi_bytes.h"
#include "env/environment.h"
#include "rollout/episode_runner.h"
#include "rollout/streaming_router.h"
#include "train/packed_batch.h"
#include "tokenizer/byte_tokenizer.h"
#include "../support/three_turn_environment.h"
#include "../support/tiny_model.h"

namespace slimpi {
namespace {

using testing::ThreeTurnEnvironment;

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
  auto router = std::make_unique<StreamingRouter>(*engine, nullptr, MPI_COMM_WORLD, cfg.max_running, params());
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
      router = std::make_unique<StreamingRouter>(*engine, nullptr, MPI_COMM_WORLD, cfg.max_running, params());
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
    StreamingRouter router(engine, nullptr, MPI_COMM_SELF, cfg.max_running, params());
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

EpisodeSettings episode_settings() {
  EpisodeSettings s;
  s.env.name = "three_turns";
  s.env.max_total_tokens = 120;  // 3 turns of up to 24 tokens and 2 observations of ~16
  s.max_turn_tokens = params().max_new_tokens;
  s.stream = 7;
  return s;
}

Prompt record_of(int g) {
  Prompt p;
  p.index = g;
  p.line = g + 1;
  p.text = "prompt " + std::to_string(g);
  return p;
}

// How the environment of the resumed ranks behaves.
enum class Resumed { Deterministic, NotDeterministic, Diverging, Snapshots };
// Replayed and restored episodes run split in two contexts (a new context after turn 1).
bool split_trajectories(Resumed r) { return r == Resumed::Deterministic || r == Resumed::Snapshots; }

// One rank's engine, environment and episode runner (a resumed job builds new ones).
struct EpisodeRank {
  EpisodeRank(const Transformer& model, bool deterministic, int64_t version, std::string salt = "",
              bool snapshots = false, int64_t new_context_at = 0)
      : engine(engine_config(), model), env(deterministic, std::move(salt), snapshots, new_context_at),
        runner(engine, env, tokenizer, episode_settings(), no_prompts, 0) {
    if (version > 0) engine.on_weights_updated(version);
  }
  ByteTokenizer tokenizer;
  Engine engine;
  ThreeTurnEnvironment env;
  std::vector<Prompt> no_prompts;
  EpisodeRunner runner;
};

struct EpisodeRun {
  std::vector<Sample> samples;        // the router's, in (group, sample) order
  std::map<std::pair<int64_t, int64_t>, int64_t> resumed;  // router: (group, sample) -> first token's version at the snapshot
  // router: the resumed with a recorded observation (a step answered) to check their replay against
  std::set<std::pair<int64_t, int64_t>> recorded_observations;
  int64_t restart_version = 0;
  int64_t open_turns = 0, waiting = 0, turns_done = 0;  // of the resumed: in a turn, waiting for a reply; their turns
  int64_t with_snapshot = 0;   // router: the items of the snapshot that hold an environment's snapshot
  int64_t in_second_context = 0;  // router: the items of the snapshot taking a turn in their second context
  int64_t restores_after = 0;  // the resumed ranks' environments, over all ranks
};

// As run_paused, with episodes; the snapshot at pause kSnapshotPause (after 56 router
// iterations: episodes past their first turns, some in a turn, some waiting for a reply)
// restores into new ranks.
constexpr int kSnapshotPause = 6;
EpisodeRun run_episodes_paused(const Transformer& model, Resumed resumed) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const bool snapshots = resumed == Resumed::Snapshots;
  const int64_t new_context_at = split_trajectories(resumed) ? 1 : 0;
  auto ep = std::make_unique<EpisodeRank>(model, true, 0, "", snapshots, new_context_at);
  auto make_router = [&] {
    return std::make_unique<StreamingRouter>(ep->engine, &ep->runner, MPI_COMM_WORLD, engine_config().max_running,
                                             params());
  };
  auto router = make_router();
  EpisodeRun out;
  int next = 0, finished = 0;
  StreamingRouter::Hooks hooks;
  hooks.next_group = [&]() -> std::optional<WorkItem> {
    if (next >= kGroups) return std::nullopt;
    WorkItem w;
    w.request = request(next, false);
    w.record = record_of(next++);
    return w;
  };
  hooks.on_group = [&](std::vector<Sample> g) {
    EXPECT_EQ(int64_t(g.size()), 3);
    for (auto& s : g) out.samples.push_back(std::move(s));
    ++finished;
  };
  int64_t version = 0;
  for (int pause = 0;; ++pause) {
    int polls = 0;
    hooks.should_pause = [&] { return ++polls > 2 + 2 * pause; };
    router->run(hooks);
    int all_done = rank == 0 && finished == kGroups;
    MPI_Bcast(&all_done, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (all_done) break;
    if (pause > 400) {
      ADD_FAILURE() << "groups still missing after " << pause << " pauses";
      break;
    }
    router->update_weights(++version, PartialPolicy::Continue);  // same weights, a new version number
    if (pause == kSnapshotPause) {
      StreamState state = router->snapshot();
      for (const WorkItem& w : state.work) {
        out.with_snapshot += !w.episode.env_snapshot.empty();
        out.in_second_context += !w.partial.context_starts.empty() && w.episode.open_turn > w.partial.context_starts.back();
      }
      for (const WorkItem& w : state.work)
        if (w.response_length() > 0) {
          out.resumed[{w.partial.group_index, w.partial.index}] = w.partial.weight_version();
          out.open_turns += w.episode.open_turn >= 0;
          out.waiting += w.episode.open_turn < 0;
          out.turns_done += int64_t(w.episode.turn_ends.size());
          const size_t answered = w.episode.turn_ends.size() - (w.episode.open_turn < 0 ? 1 : 0);
          if (!w.episode.turn_ends.empty() && answered > 0)
            out.recorded_observations.insert({w.partial.group_index, w.partial.index});
        }
      router.reset();
      // Snapshots: an environment that cannot replay (not deterministic) restores instead.
      ep = std::make_unique<EpisodeRank>(model, resumed == Resumed::Deterministic || resumed == Resumed::Diverging,
                                         version, resumed == Resumed::Diverging ? "!" : "", snapshots, new_context_at);
      router = make_router();
      out.restart_version = version;
      if (rank == 0) router->restore(std::move(state));
    }
  }
  std::sort(out.samples.begin(), out.samples.end(), [](const auto& a, const auto& b) {
    return std::tie(a.group_index, a.index) < std::tie(b.group_index, b.index);
  });
  MPI_Allreduce(&ep->env.restores, &out.restores_after, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return out;
}

// An environment that opens a new context after turn 1 splits every trajectory in two
// (Sample::context_starts): the engine runs the second context as a sequence of its own,
// and the trainer, packing each context as its own sequence, scores every model token as
// the engine did (each rank runs it alone).
TEST(SplitEpisodes, TheTrainerScoresEachContextAsTheEngineRanIt) {
  Transformer model(testing::tiny_model_config(1024, 0.2), 13, at::kCPU);
  std::vector<Prompt> records;
  for (int g = 0; g < 4; ++g) records.push_back(record_of(g));
  ByteTokenizer tokenizer;
  auto run = [&](double temperature) {
    Engine engine(engine_config(), model);
    ThreeTurnEnvironment env(true, "", false, /*new_context_at=*/1);
    EpisodeRunner runner(engine, env, tokenizer, episode_settings(), records, 0);
    for (int g = 0; g < 4; ++g) {
      GenerationRequest r = request(g);
      r.params.temperature = temperature;
      runner.add_request(r);
    }
    std::vector<Sample> got;
    while (runner.has_work())
      for (Sample& s : runner.step()) got.push_back(std::move(s));
    return got;
  };
  // Model turns as token lists, in order.
  auto model_turns = [](const Sample& s) {
    std::vector<std::vector<int64_t>> turns;
    for (int64_t t = 0; t < s.response_length(); ++t)
      if (s.loss_mask[size_t(t)] != 0.0f) {
        if (t == 0 || s.loss_mask[size_t(t - 1)] == 0.0f) turns.emplace_back();
        turns.back().push_back(s.tokens[size_t(s.prompt_length + t)]);
      }
    return turns;
  };
  // Turns 2 and 3 both run in the second context: their draws continue there (the
  // sampling counter is the position in the context's response), never start over. At a
  // temperature that makes every distribution nearly uniform a token is its draw: turns
  // that reused their draws would begin alike.
  int64_t same_start = 0;
  for (const Sample& s : run(1000.0)) {
    const auto turns = model_turns(s);
    ASSERT_EQ(turns.size(), 3u);
    same_start += turns[1][0] == turns[2][0];
  }
  EXPECT_LE(same_start, 2) << "the second context's turns begin with the same draws";
  const std::vector<Sample> got = run(1.0);
  ASSERT_EQ(got.size(), 12u);
  const std::vector<int64_t> opened = tokenizer.encode_prompt("new context 1\n");
  int64_t differ_unsplit = 0;
  for (const Sample& s : got) {
    const std::string where = "group " + std::to_string(s.group_index) + " sample " + std::to_string(s.index);
    ASSERT_EQ(s.status, SampleStatus::Completed) << where;
    EXPECT_EQ(s.env_turns, 3) << where;
    ASSERT_EQ(s.context_starts.size(), 1u) << where;
    const int64_t c = s.context_starts[0], P = s.prompt_length;
    // The new context is the environment's message alone, then the model's turns.
    ASSERT_LE(c + int64_t(opened.size()), s.response_length()) << where;
    EXPECT_TRUE(std::equal(opened.begin(), opened.end(), s.tokens.begin() + P + c)) << where;
    for (size_t t = 0; t < opened.size(); ++t) EXPECT_EQ(s.loss_mask[size_t(c) + t], 0.0f) << where;
    const TokenLogProbs split = packed_log_probs(model, pack({s}, {0}, at::kCPU), Precision::FP32, 1.0, false);
    Sample joined = s;
    joined.context_starts.clear();
    const TokenLogProbs whole = packed_log_probs(model, pack({joined}, {0}, at::kCPU), Precision::FP32, 1.0, false);
    ASSERT_EQ(split.logp.numel(), s.response_length()) << where;
    int64_t model_tokens_after = 0;
    for (int64_t t = 0; t < s.response_length(); ++t) {
      if (s.loss_mask[size_t(t)] == 0.0f) continue;
      EXPECT_NEAR(split.logp[t].item<float>(), s.rollout_log_probs[size_t(t)], 1e-4) << where << " token " << t;
      if (t > c) {
        ++model_tokens_after;
        differ_unsplit += std::abs(whole.logp[t].item<float>() - s.rollout_log_probs[size_t(t)]) > 1e-3;
      }
    }
    EXPECT_GT(model_tokens_after, 0) << where;
    EXPECT_EQ(model_turns(s).size(), 3u) << where;
  }
  EXPECT_GT(differ_unsplit, 0) << "scored as one sequence, the second context's tokens would not differ";
}

class StreamingEpisodesTest : public ::testing::TestWithParam<Resumed> {};

TEST_P(StreamingEpisodesTest, PausesUpdatesAndARestartChangeNoToken) {
  const Resumed resumed = GetParam();
  Transformer model(testing::tiny_model_config(1024, 0.2), 13, at::kCPU);
  EpisodeRun got = run_episodes_paused(model, resumed);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    EXPECT_TRUE(got.samples.empty());
    return;
  }
  // The same episodes, straight through one engine.
  std::vector<Prompt> records;
  for (int g = 0; g < kGroups; ++g) records.push_back(record_of(g));
  ByteTokenizer tokenizer;
  Engine alone(engine_config(), model);
  ThreeTurnEnvironment env(true, "", resumed == Resumed::Snapshots, split_trajectories(resumed) ? 1 : 0);
  EpisodeRunner runner(alone, env, tokenizer, episode_settings(), records, 0);
  for (int g = 0; g < kGroups; ++g) runner.add_request(request(g, false));
  std::vector<Sample> straight;
  while (runner.has_work())
    for (Sample& s : runner.step()) straight.push_back(std::move(s));
  std::sort(straight.begin(), straight.end(), [](const auto& a, const auto& b) {
    return std::tie(a.group_index, a.index) < std::tie(b.group_index, b.index);
  });
  ASSERT_EQ(got.samples.size(), straight.size());
  int64_t multi_turn = 0, split = 0;
  for (size_t i = 0; i < straight.size(); ++i) {
    const Sample &a = got.samples[i], &b = straight[i];
    ASSERT_EQ(a.group_index, b.group_index);
    ASSERT_EQ(a.index, b.index);
    const std::string where = "group " + std::to_string(a.group_index) + " sample " + std::to_string(a.index);
    if (resumed == Resumed::Diverging) {
      // A replay that met an observation other than the recorded one fails its episode
      // (its group not trained). The others run on with the new observations: not compared.
      if (got.recorded_observations.count({a.group_index, a.index})) {
        EXPECT_EQ(a.status, SampleStatus::EnvFailed) << where;
        EXPECT_EQ(a.env_error, int8_t(EnvError::Infra)) << where;
      }
      multi_turn += a.env_turns > 1;
      continue;
    }
    EXPECT_EQ(a.status, b.status) << where;
    EXPECT_EQ(a.tokens, b.tokens) << where;
    EXPECT_EQ(a.prompt_length, b.prompt_length) << where;
    EXPECT_EQ(a.loss_mask, b.loss_mask) << where;
    EXPECT_EQ(a.env_turns, b.env_turns) << where;
    EXPECT_EQ(a.context_starts, b.context_starts) << where;
    split += !a.context_starts.empty();
    EXPECT_EQ(a.raw_reward, b.raw_reward) << where;
    ASSERT_EQ(a.rollout_log_probs.size(), b.rollout_log_probs.size()) << where;
    for (size_t t = 0; t < a.rollout_log_probs.size(); ++t)
      EXPECT_NEAR(a.rollout_log_probs[t], b.rollout_log_probs[t], 1e-5) << where << " token " << t;
    multi_turn += a.env_turns > 1;
  }
  EXPECT_GT(multi_turn, 0);
  if (split_trajectories(resumed)) EXPECT_GT(split, 0) << "no trajectory was split into two contexts";
  // Episodes under way at the snapshot: replayed, they keep the tokens (and versions) they
  // had (all older than the restart's); restarted, they are sampled again, at the
  // restart's version or later.
  ASSERT_FALSE(got.resumed.empty()) << "no episode was under way at the snapshot";
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == 1) {  // one rank's schedule does not depend on timing: both kinds resumed, with turns to replay
    EXPECT_FALSE(got.recorded_observations.empty());
    EXPECT_GT(got.open_turns, 0);
    EXPECT_GT(got.waiting, 0);
    EXPECT_GT(got.turns_done, 0);
    if (split_trajectories(resumed)) EXPECT_GT(got.in_second_context, 0);
  }
  // With snapshots every episode past its reset was restored (in a turn: it continued;
  // waiting for a reply: its turn was sent again), none replayed; without them none was.
  EXPECT_EQ(got.restores_after, got.with_snapshot);
  if (resumed == Resumed::Snapshots) {
    EXPECT_GE(got.with_snapshot, int64_t(got.resumed.size()));
  } else {
    EXPECT_EQ(got.with_snapshot, 0);
  }
  for (const Sample& s : got.samples) {
    const auto r = got.resumed.find({s.group_index, s.index});
    if (r == got.resumed.end()) continue;
    ASSERT_LT(r->second, got.restart_version);
    if (resumed == Resumed::Diverging) continue;  // checked above
    if (resumed == Resumed::Deterministic || resumed == Resumed::Snapshots)
      EXPECT_EQ(s.weight_version(), r->second) << "group " << s.group_index << " sample " << s.index;
    else
      EXPECT_GE(s.weight_version(), got.restart_version) << "group " << s.group_index << " sample " << s.index;
  }
}

std::string resumed_name(const ::testing::TestParamInfo<Resumed>& info) {
  static const char* const names[] = {"Deterministic", "NotDeterministic", "Diverging", "Snapshots"};
  return names[int(info.param)];
}

INSTANTIATE_TEST_SUITE_P(Environments, StreamingEpisodesTest,
                         ::testing::Values(Resumed::Deterministic, Resumed::NotDeterministic, Resumed::Diverging,
                                           Resumed::Snapshots),
                         resumed_name);

}  // namespace
}  // namespace slimpi
