// The episode runner alone (rollout/episode_runner.h), on one engine and an in-process
// scripted environment that answers at once: the trajectory an episode makes (reset,
// turns, observations, done), the limits that end it (an over-long observation), a new
// context splitting it, threads resumed in new contexts and kept once each, and resume: a snapshot taken mid-run continued by a fresh
// runner, engine and environment (replayed into a deterministic one, restored into one
// that takes snapshots) gives the uninterrupted episodes; a replay that meets another
// observation fails its episode.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "env/environment.h"
#include "kernels/counter_rng.h"
#include "model/transformer.h"
#include "rollout/episode_runner.h"
#include "tokenizer/byte_tokenizer.h"
#include "../../support/tiny_model.h"

namespace slimpi {
namespace {

constexpr int64_t kTurnTokens = 12;
constexpr int kGroups = 3;

// Every step's reply, a function of the action (its turn and text).
using StepScript = std::function<EnvReply(const EpisodeAction&)>;

// Replies at the next poll, in request order. With `snapshots` it keeps each episode's
// turn count as its state and restores from it.
class ScriptedEnvironment : public Environment {
 public:
  ScriptedEnvironment(StepScript step, bool snapshots = false, std::vector<ChatMessage> reset_messages = {})
      : step_(std::move(step)), reset_messages_(std::move(reset_messages)) {
    info_.protocol_version = 1;
    info_.name = "scripted";
    info_.max_concurrent_episodes = 1 << 20;
    info_.deterministic = true;
    info_.snapshots = snapshots;
  }
  const EnvInfo& info() const override { return info_; }
  void reset(const EpisodeStart& start) override {
    ++resets;
    EnvReply r;
    r.episode = start.episode;
    r.messages = reset_messages_;
    if (info_.snapshots) r.snapshot = R"({"turns":0})";
    replies_.push_back(r);
  }
  void restore(const EpisodeStart& start, int64_t turns, const std::string& snapshot) override {
    ++restores;
    EXPECT_EQ(nlohmann::json::parse(snapshot).at("turns").get<int64_t>(), turns) << start.episode;
    EnvReply r;
    r.episode = start.episode;
    r.restored = true;
    replies_.push_back(r);
  }
  void step(const EpisodeAction& a) override {
    actions[a.episode].push_back(a);
    EnvReply r = step_(a);
    r.episode = a.episode;
    if (info_.snapshots) r.snapshot = nlohmann::json{{"turns", a.turn}}.dump();
    replies_.push_back(r);
  }
  void close(const std::string&) override {}
  std::vector<EnvReply> poll(double) override {
    std::vector<EnvReply> out;
    out.swap(replies_);
    return out;
  }
  int64_t capacity() const override { return info_.max_concurrent_episodes; }

  std::map<std::string, std::vector<EpisodeAction>> actions;  // every step received, by episode
  int64_t resets = 0, restores = 0;

 private:
  EnvInfo info_;
  StepScript step_;
  std::vector<ChatMessage> reset_messages_;
  std::vector<EnvReply> replies_;
};

// Three model turns: turns 1 and 2 answered by a user message, turn 3 ends the episode.
EnvReply three_turns(const EpisodeAction& a, const std::string& salt = "") {
  EnvReply r;
  if (a.turn >= 3) {
    r.done = true;
    r.reward = a.text.size() % 2 == 0 ? 1.0 : 0.5;
  } else {
    r.messages = {{"user", "observation " + std::to_string(a.turn) + salt, false, ""}};
    r.reward = 0.25;
  }
  return r;
}

GenerationRequest request(int g) {
  GenerationRequest r;
  r.group_index = g;
  r.prompt = {ByteTokenizer::kBos};
  for (int i = 0; i < 4 + g; ++i) r.prompt.push_back((g * 31 + i * 7) % 256);
  r.n_samples = 2;
  r.params.max_new_tokens = kTurnTokens;
  r.params.stop_token_ids = {ByteTokenizer::kEos};
  r.seed = mix_seed(9, 2, uint64_t(g));
  return r;
}

std::vector<Prompt> records() {
  std::vector<Prompt> out;
  for (int g = 0; g < kGroups; ++g) {
    Prompt p;
    p.index = g;
    p.line = g + 1;
    p.text = "prompt " + std::to_string(g);
    out.push_back(p);
  }
  return out;
}

EpisodeSettings settings() {
  EpisodeSettings s;
  s.env.name = "scripted";
  s.env.max_total_tokens = 200;
  s.max_turn_tokens = kTurnTokens;
  s.stream = 3;
  return s;
}

EngineConfig engine_config() {
  EngineConfig c{16, 32768, 4, 1024, true};
  c.cache_responses = true;  // as RolloutSide sets it with an environment
  return c;
}

// One rank's parts; a resumed run builds new ones.
struct Rollout {
  Rollout(const Transformer& model, ScriptedEnvironment* environment, const EpisodeSettings& s = settings())
      : engine(engine_config(), model), env(environment), runner(engine, *env, tokenizer, s, prompts, 0) {}
  ByteTokenizer tokenizer;
  std::vector<Prompt> prompts = records();
  Engine engine;
  ScriptedEnvironment* env;
  EpisodeRunner runner;

  // Runs until no work is left, or `steps` runner steps; the finished samples by (group, sample).
  std::map<std::pair<int64_t, int64_t>, Sample> run(int64_t steps = -1) {
    std::map<std::pair<int64_t, int64_t>, Sample> out;
    for (int64_t i = 0; runner.has_work() && (steps < 0 || i < steps); ++i)
      for (Sample& s : runner.step()) out[{s.group_index, s.index}] = std::move(s);
    return out;
  }
};

// The response offsets of each run of equal loss-mask values: [begin, end) and the value.
struct MaskRun {
  int64_t begin, end;
  float mask;
};
std::vector<MaskRun> mask_runs(const Sample& s) {
  std::vector<MaskRun> runs;
  for (int64_t t = 0; t < int64_t(s.loss_mask.size()); ++t)
    if (runs.empty() || runs.back().mask != s.loss_mask[size_t(t)]) runs.push_back({t, t + 1, s.loss_mask[size_t(t)]});
    else runs.back().end = t + 1;
  return runs;
}

std::vector<int64_t> response_tokens(const Sample& s, int64_t begin, int64_t end) {
  const auto at = s.tokens.begin() + s.prompt_length;
  return {at + begin, at + end};
}

class EpisodeRunnerTest : public ::testing::Test {
 protected:
  Transformer model{testing::tiny_model_config(1024, 0.2), 17, at::kCPU};
};

TEST_F(EpisodeRunnerTest, TurnsAndObservationsMakeOneTrajectory) {
  ScriptedEnvironment env([](const EpisodeAction& a) { return three_turns(a); });
  Rollout r(model, &env);
  for (int g = 0; g < kGroups; ++g) r.runner.add_request(request(g));
  const auto got = r.run();
  ASSERT_EQ(got.size(), size_t(kGroups * 2));
  for (const auto& [key, s] : got) {
    SCOPED_TRACE("group " + std::to_string(key.first) + " sample " + std::to_string(key.second));
    EXPECT_EQ(s.status, SampleStatus::Completed);
    EXPECT_EQ(s.env_turns, 3);
    EXPECT_EQ(s.tokens.size(), size_t(s.prompt_length + s.response_length()));
    EXPECT_EQ(std::vector<int64_t>(s.tokens.begin(), s.tokens.begin() + s.prompt_length), request(int(key.first)).prompt);
    const std::vector<EpisodeAction>& actions = env.actions.at("3/" + std::to_string(key.first) + "/" +
                                                                std::to_string(key.second));
    ASSERT_EQ(actions.size(), 3u);
    // model turn, observation, model turn, observation, model turn
    const std::vector<MaskRun> runs = mask_runs(s);
    ASSERT_EQ(runs.size(), 5u);
    for (size_t k = 0; k < runs.size(); ++k) {
      const MaskRun& run = runs[k];
      EXPECT_EQ(run.mask, k % 2 == 0 ? 1.0f : 0.0f);
      const std::vector<int64_t> tokens = response_tokens(s, run.begin, run.end);
      if (k % 2 == 0) {  // the tokens the model sampled are the ones the environment was sent
        EXPECT_EQ(tokens, actions[k / 2].token_ids) << "turn " << k / 2 + 1;
        EXPECT_LE(int64_t(tokens.size()), kTurnTokens);
      } else {
        EXPECT_NE(r.tokenizer.decode(tokens).find("observation " + std::to_string(k / 2 + 1)), std::string::npos);
      }
      for (int64_t t = run.begin; t < run.end; ++t) {
        if (run.mask == 0.0f) EXPECT_EQ(s.rollout_log_probs[size_t(t)], 0.0f) << "token " << t;
        else EXPECT_LE(s.rollout_log_probs[size_t(t)], 0.0f) << "token " << t;
      }
    }
    // rollout.env_reward = "last": the reward of the reply that ended it
    EXPECT_EQ(s.raw_reward, actions[2].text.size() % 2 == 0 ? 1.0f : 0.5f);
    EXPECT_TRUE(s.context_starts.empty());
  }
}

TEST_F(EpisodeRunnerTest, AnOverlongObservationEndsTheEpisodeTruncated) {
  ScriptedEnvironment env([](const EpisodeAction&) {
    EnvReply r;
    r.messages = {{"user", std::string(40, 'x'), false, ""}};
    return r;
  });
  EpisodeSettings s = settings();
  s.env.max_observation_tokens = 8;
  Rollout r(model, &env, s);
  r.runner.add_request(request(0));
  for (const auto& [key, sample] : r.run()) {
    EXPECT_EQ(sample.status, SampleStatus::Truncated);
    EXPECT_EQ(sample.env_error, int8_t(EnvError::Overlong));
    EXPECT_EQ(sample.env_turns, 1);
    ASSERT_EQ(mask_runs(sample).size(), 1u);  // the first turn alone: the observation was not appended
    EXPECT_EQ(mask_runs(sample)[0].mask, 1.0f);
  }
}

// An environment that ends the episode after a turn the episode's token budget cut (5 tokens
// here, under rollout.max_new_tokens = 12): the sample is truncated, with the environment's
// reward; a turn that stopped on its own before the budget stays completed.
TEST_F(EpisodeRunnerTest, ALastTurnCutAtTheBudgetIsTruncated) {
  ScriptedEnvironment env([](const EpisodeAction&) {
    EnvReply r;
    r.done = true;
    r.reward = 1.0;
    return r;
  });
  EpisodeSettings s = settings();
  s.env.max_total_tokens = 5;
  Rollout r(model, &env, s);
  for (int g = 0; g < kGroups; ++g) r.runner.add_request(request(g));
  int cut = 0;
  const auto got = r.run();
  ASSERT_EQ(got.size(), size_t(kGroups * 2));
  for (const auto& [key, sample] : got) {
    const EpisodeAction& a = env.actions.at("3/" + std::to_string(key.first) + "/" + std::to_string(key.second)).at(0);
    EXPECT_EQ(sample.raw_reward, 1.0f);
    if (a.finish_reason == "length") {
      EXPECT_EQ(sample.response_length(), 5);
      EXPECT_EQ(sample.status, SampleStatus::Truncated);
      ++cut;
    } else {
      EXPECT_EQ(sample.status, SampleStatus::Completed);
    }
  }
  EXPECT_GT(cut, 0);  // (a random policy: each turn stops early on EOS with probability ~2%)
}

TEST_F(EpisodeRunnerTest, AnOverlongFirstObservationFailsTheEpisode) {
  ScriptedEnvironment env([](const EpisodeAction& a) { return three_turns(a); }, false,
                          {{"user", std::string(40, 'y'), false, ""}});
  EpisodeSettings s = settings();
  s.env.max_observation_tokens = 8;
  Rollout r(model, &env, s);
  r.runner.add_request(request(0));
  const auto got = r.run();
  ASSERT_EQ(got.size(), 2u);
  for (const auto& [key, sample] : got) {
    EXPECT_EQ(sample.status, SampleStatus::EnvFailed);
    EXPECT_EQ(sample.env_error, int8_t(EnvError::Overlong));
    EXPECT_EQ(sample.env_turns, 0);
  }
  EXPECT_TRUE(env.actions.empty());
}

TEST_F(EpisodeRunnerTest, ANewContextSplitsTheTrajectory) {
  ScriptedEnvironment env([](const EpisodeAction& a) {
    EnvReply r = three_turns(a);
    if (a.turn == 1) {
      r.messages = {{"user", "a fresh context", false, ""}};
      r.new_context = true;
    }
    return r;
  });
  Rollout r(model, &env);
  r.runner.add_request(request(1));
  for (const auto& [key, s] : r.run()) {
    EXPECT_EQ(s.status, SampleStatus::Completed);
    EXPECT_EQ(s.env_turns, 3);
    const std::vector<MaskRun> runs = mask_runs(s);
    ASSERT_EQ(runs.size(), 5u);
    // The context opens where the first turn ended, with the environment's tokens.
    ASSERT_EQ(s.context_starts, std::vector<int64_t>{runs[0].end});
    EXPECT_NE(r.tokenizer.decode(response_tokens(s, runs[1].begin, runs[1].end)).find("a fresh context"),
              std::string::npos);
    const auto& actions = env.actions.at("3/1/" + std::to_string(key.second));
    for (size_t k = 0; k < 3; ++k)
      EXPECT_EQ(response_tokens(s, runs[2 * k].begin, runs[2 * k].end), actions[k].token_ids) << "turn " << k + 1;
  }
}

// An episode whose turns go through threads in the order `pattern` names them ("ABACA":
// turn 1 in thread A, turn 2 in B, ...): each reply but the last opens a new context, a
// thread's first as "thread X", a return to it as "back to X", which resumes the context
// of the thread's latest turn (turn j's context is j - 1).
StepScript threads(const std::string& pattern) {
  return [pattern](const EpisodeAction& a) {
    EnvReply r = three_turns(a);
    const size_t t = size_t(a.turn);
    r.done = t >= pattern.size();
    if (r.done) return r;
    const char next = pattern[t];
    const size_t last = pattern.rfind(next, t - 1);
    r.messages = {{"user", std::string(last == std::string::npos ? "thread " : "back to ") + next, false, ""}};
    r.new_context = true;
    if (last != std::string::npos) r.resume_context = int64_t(last);
    return r;
  };
}

// Three threads: A (the reset's), B and C, the episode going A B A C A. A's returns are new
// contexts that resume A's latest (EnvReply::resume_context): they open with its tokens as
// the engine sampled them, then the delta. The finished sample keeps each thread once, in
// the order they began (rollout/context_threads.h): A's turns 1, 3, 5 with the observations
// between, B's turn 2 and C's turn 4, each turn the tokens its action carried.
TEST_F(EpisodeRunnerTest, AResumedContextContinuesItsThreadAndEachThreadIsKeptOnce) {
  ScriptedEnvironment env(threads("ABACA"));
  Rollout r(model, &env);
  r.runner.add_request(request(2));
  const auto got = r.run();
  ASSERT_EQ(got.size(), 2u);
  for (const auto& [key, s] : got) {
    SCOPED_TRACE("sample " + std::to_string(key.second));
    EXPECT_EQ(s.status, SampleStatus::Completed);
    EXPECT_EQ(s.env_turns, 5);
    const auto& actions = env.actions.at("3/2/" + std::to_string(key.second));
    ASSERT_EQ(actions.size(), 5u);
    for (int64_t k = 0; k < 5; ++k) EXPECT_EQ(actions[size_t(k)].context, k) << "turn " << k + 1;  // each in a new context
    const std::vector<MaskRun> runs = mask_runs(s);
    ASSERT_EQ(runs.size(), 9u);  // A: turn, obs, turn, obs, turn; B: opening, turn; C: opening, turn
    for (size_t k = 0; k < runs.size(); ++k) EXPECT_EQ(runs[k].mask, k % 2 == 0 ? 1.0f : 0.0f) << "run " << k;
    EXPECT_EQ(s.context_starts, (std::vector<int64_t>{runs[5].begin, runs[7].begin}));
    const size_t turn_run[] = {0, 6, 2, 8, 4};  // turn k+1's run
    for (size_t k = 0; k < 5; ++k)
      EXPECT_EQ(response_tokens(s, runs[turn_run[k]].begin, runs[turn_run[k]].end), actions[k].token_ids)
          << "turn " << k + 1;
    auto text_of = [&](size_t run) { return r.tokenizer.decode(response_tokens(s, runs[run].begin, runs[run].end)); };
    EXPECT_NE(text_of(1).find("back to A"), std::string::npos);
    EXPECT_NE(text_of(3).find("back to A"), std::string::npos);
    EXPECT_NE(text_of(5).find("thread B"), std::string::npos);
    EXPECT_NE(text_of(7).find("thread C"), std::string::npos);
    // The engine continued A from its own tokens: turns 3 and 5 saw the prompt and A's trajectory before them.
    EXPECT_EQ(actions[2].context_tokens, s.prompt_length + runs[2].begin);
    EXPECT_EQ(actions[4].context_tokens, s.prompt_length + runs[4].begin);
    // Every model token keeps the log-prob it was sampled with (none left as a copy's zero).
    ASSERT_EQ(s.rollout_log_probs.size(), s.loss_mask.size());
    ASSERT_EQ(s.weight_versions.size(), s.loss_mask.size());
    for (size_t t = 0; t < s.loss_mask.size(); ++t) {
      if (s.loss_mask[t] == 1.0f) EXPECT_LT(s.rollout_log_probs[t], 0.0f) << "token " << t;
      else EXPECT_EQ(s.rollout_log_probs[t], 0.0f) << "token " << t;
    }
  }
}

// A B C B: the reset's thread is never resumed; B's return joins B's two contexts, and the
// threads keep the order they began in (A, B, C).
TEST_F(EpisodeRunnerTest, ThreadsKeepTheOrderTheyBeganIn) {
  ScriptedEnvironment env(threads("ABCB"));
  Rollout r(model, &env);
  r.runner.add_request(request(1));
  for (const auto& [key, s] : r.run()) {
    EXPECT_EQ(s.status, SampleStatus::Completed);
    const auto& actions = env.actions.at("3/1/" + std::to_string(key.second));
    ASSERT_EQ(actions.size(), 4u);
    const std::vector<MaskRun> runs = mask_runs(s);
    ASSERT_EQ(runs.size(), 7u);  // A: turn; B: opening, turn, obs, turn; C: opening, turn
    EXPECT_EQ(s.context_starts, (std::vector<int64_t>{runs[1].begin, runs[5].begin}));
    const size_t turn_run[] = {0, 2, 6, 4};
    for (size_t k = 0; k < 4; ++k)
      EXPECT_EQ(response_tokens(s, runs[turn_run[k]].begin, runs[turn_run[k]].end), actions[k].token_ids)
          << "turn " << k + 1;
    EXPECT_NE(r.tokenizer.decode(response_tokens(s, runs[3].begin, runs[3].end)).find("back to B"), std::string::npos);
    EXPECT_EQ(actions[3].context_tokens, runs[3].end - runs[1].begin);  // B's thread alone, its copy included
  }
}

// A return's copy of its thread counts once, where the finished sample keeps it: under an
// observation limit of 12 tokens, a return whose new message is 10 ("back to A\n") goes on,
// though with the copy of context 0 (the prompt and turn 1) the new context opens with more.
TEST_F(EpisodeRunnerTest, AResumedContextsCopyIsNotAnObservation) {
  ScriptedEnvironment env(threads("ABA"));
  EpisodeSettings limited = settings();
  limited.env.max_observation_tokens = 12;
  Rollout r(model, &env, limited);
  r.runner.add_request(request(2));
  for (const auto& [key, s] : r.run()) {
    EXPECT_EQ(s.status, SampleStatus::Completed);
    EXPECT_EQ(s.env_turns, 3);
    const auto& actions = env.actions.at("3/2/" + std::to_string(key.second));
    ASSERT_EQ(actions.size(), 3u);
    EXPECT_GT(actions[2].context_tokens - int64_t(actions[0].token_ids.size()), 12);  // the new context's opening
  }
}

// An environment that resumes a context the episode has not left, or one a later context
// continues already, fails that episode (infra), not the job.
TEST_F(EpisodeRunnerTest, ResumingAContextThatCannotBeResumedFailsTheEpisode) {
  auto not_left = [](const EpisodeAction& a) {
    EnvReply r = three_turns(a);
    r.new_context = true;
    r.resume_context = a.turn;  // after turn 1: context 1, which does not exist yet
    return r;
  };
  auto twice = [](const EpisodeAction& a) {  // A B A, then context 0 again instead of 2
    EnvReply r = threads("ABAB")(a);
    if (a.turn == 3) r.resume_context = 0;
    return r;
  };
  for (const auto& [script, turns] : std::vector<std::pair<StepScript, int32_t>>{{not_left, 1}, {twice, 3}}) {
    ScriptedEnvironment env(script);
    Rollout r(model, &env);
    r.runner.add_request(request(0));
    const auto got = r.run();
    ASSERT_EQ(got.size(), 2u);
    for (const auto& [key, s] : got) {
      EXPECT_EQ(s.status, SampleStatus::EnvFailed);
      EXPECT_EQ(s.env_error, int8_t(EnvError::Infra));
      EXPECT_EQ(s.env_turns, turns);
    }
  }
}

// A run stopped after `steps` runner steps, its snapshot continued by fresh parts (with
// `env`), against the same episodes straight through.
struct Resumed {
  std::map<std::pair<int64_t, int64_t>, Sample> samples;  // before and after the snapshot
  int64_t recorded_turns = 0, open_turns = 0, waiting = 0;  // of the snapshot's items
  int64_t finished_before = 0;  // episodes that ended before the snapshot
};

Resumed resume_after(const Transformer& model, int64_t steps, ScriptedEnvironment* first,
                     ScriptedEnvironment* second) {
  Resumed out;
  std::vector<WorkItem> items;
  {
    Rollout before(model, first);
    for (int g = 0; g < kGroups; ++g) before.runner.add_request(request(g));
    out.samples = before.run(steps);
    out.finished_before = int64_t(out.samples.size());
    items = before.runner.snapshot(before.engine.in_flight());
  }
  for (const WorkItem& w : items) {
    out.recorded_turns += int64_t(w.episode.turn_ends.size());
    out.open_turns += w.episode.open_turn >= 0;
    out.waiting += !w.episode.turn_ends.empty() && w.episode.open_turn < 0;
  }
  Rollout after(model, second);
  for (const WorkItem& w : items) after.runner.add_work(w);
  for (auto& [key, s] : after.run()) out.samples[key] = std::move(s);
  return out;
}

void expect_same_episodes(const std::map<std::pair<int64_t, int64_t>, Sample>& got,
                          const std::map<std::pair<int64_t, int64_t>, Sample>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [key, b] : want) {
    const Sample& a = got.at(key);
    SCOPED_TRACE("group " + std::to_string(key.first) + " sample " + std::to_string(key.second));
    EXPECT_EQ(a.status, b.status);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.context_starts, b.context_starts);
    EXPECT_EQ(a.loss_mask, b.loss_mask);
    EXPECT_EQ(a.env_turns, b.env_turns);
    EXPECT_EQ(a.raw_reward, b.raw_reward);
    ASSERT_EQ(a.rollout_log_probs.size(), b.rollout_log_probs.size());
    // Recorded log-probs are copied; those sampled after the resume come from batches of
    // another composition: fp32 round-off of a 2-layer model's logits, far below 1e-5.
    for (size_t t = 0; t < a.rollout_log_probs.size(); ++t)
      EXPECT_NEAR(a.rollout_log_probs[t], b.rollout_log_probs[t], 1e-5) << "token " << t;
  }
}

TEST_F(EpisodeRunnerTest, ASnapshotReplayedIntoFreshPartsGivesTheUninterruptedEpisodes) {
  ScriptedEnvironment straight_env([](const EpisodeAction& a) { return three_turns(a); });
  Rollout straight(model, &straight_env);
  for (int g = 0; g < kGroups; ++g) straight.runner.add_request(request(g));
  const auto want = straight.run();

  ScriptedEnvironment first([](const EpisodeAction& a) { return three_turns(a); });
  ScriptedEnvironment second([](const EpisodeAction& a) { return three_turns(a); });
  const Resumed got = resume_after(model, 20, &first, &second);
  // The snapshot held episodes with answered turns, some in a turn, some waiting.
  EXPECT_GT(got.recorded_turns, 0);
  EXPECT_GT(got.open_turns + got.waiting, 0);
  EXPECT_EQ(second.restores, 0);
  EXPECT_EQ(second.resets, kGroups * 2 - got.finished_before);  // every open episode reset again, then replayed
  expect_same_episodes(got.samples, want);
}

TEST_F(EpisodeRunnerTest, AnEnvironmentWithSnapshotsRestoresInsteadOfReplaying) {
  ScriptedEnvironment straight_env([](const EpisodeAction& a) { return three_turns(a); }, true);
  Rollout straight(model, &straight_env);
  for (int g = 0; g < kGroups; ++g) straight.runner.add_request(request(g));
  const auto want = straight.run();

  ScriptedEnvironment first([](const EpisodeAction& a) { return three_turns(a); }, true);
  ScriptedEnvironment second([](const EpisodeAction& a) { return three_turns(a); }, true);
  const Resumed got = resume_after(model, 20, &first, &second);
  EXPECT_GT(got.recorded_turns, 0);
  EXPECT_GT(second.restores, 0);
  EXPECT_EQ(second.restores + second.resets, kGroups * 2 - got.finished_before);
  // A restored episode is sent no turn it took before the snapshot (its waiting turn
  // again, which the checkpoint held no reply to, at most).
  for (const auto& [id, actions] : second.actions)
    for (const EpisodeAction& a : actions) EXPECT_GE(a.turn, 1) << id;
  expect_same_episodes(got.samples, want);
}

// Threads across a checkpoint: episodes going A B A C A stopped at several points and
// resumed into fresh parts, replayed (a deterministic environment) or restored from their
// snapshots (which carry the left contexts' transcripts and links), are the uninterrupted
// episodes, each thread kept once.
TEST_F(EpisodeRunnerTest, ThreadsSurviveAReplayAndARestore) {
  for (const bool snapshots : {false, true}) {
    ScriptedEnvironment straight_env(threads("ABACA"), snapshots);
    Rollout straight(model, &straight_env);
    for (int g = 0; g < kGroups; ++g) straight.runner.add_request(request(g));
    const auto want = straight.run();
    for (const auto& [key, s] : want) ASSERT_EQ(s.context_starts.size(), 2u);
    for (const int64_t steps : {15, 30, 45}) {
      SCOPED_TRACE(std::string(snapshots ? "restored" : "replayed") + " after " + std::to_string(steps) + " steps");
      ScriptedEnvironment first(threads("ABACA"), snapshots), second(threads("ABACA"), snapshots);
      const Resumed got = resume_after(model, steps, &first, &second);
      EXPECT_GT(got.recorded_turns, 0);
      EXPECT_EQ(second.restores > 0, snapshots);
      expect_same_episodes(got.samples, want);
    }
  }
}

TEST_F(EpisodeRunnerTest, AReplayThatMeetsAnotherObservationFailsItsEpisode) {
  ScriptedEnvironment first([](const EpisodeAction& a) { return three_turns(a); });
  ScriptedEnvironment second([](const EpisodeAction& a) { return three_turns(a, " (changed)"); });
  const Resumed got = resume_after(model, 20, &first, &second);
  ASSERT_GT(got.recorded_turns, 0);
  int64_t failed = 0;
  for (const auto& [key, s] : got.samples) {
    if (s.status != SampleStatus::EnvFailed) continue;
    EXPECT_EQ(s.env_error, int8_t(EnvError::Infra));
    ++failed;
  }
  // Every episode with an observation recorded before the snapshot meets a different one.
  EXPECT_GT(failed, 0);
}

}  // namespace
}  // namespace slimpi
