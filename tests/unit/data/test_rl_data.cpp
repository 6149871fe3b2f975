// RL data plumbing on one rank: task data from make-data, the prompt source (slices,
// per-epoch shuffle, cursor, bad lines), pass@k, and the train-sample wire format.
#include <gtest/gtest.h>
#include <slimpi/error.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "data/prompt_source.h"
#include "core/sample_codec.h"
#include "cli/make_data.h"
#include "reward/reward.h"
#include "rollout/evaluation.h"

namespace slimpi {
namespace {

std::string write_file(const std::string& name, const std::vector<std::string>& lines) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream out(path);
  for (const auto& l : lines) out << l << "\n";
  return path;
}

TEST(MakeData, DeterministicAndSelfConsistent) {
  auto a = make_task_data("addition", 200, 7), b = make_task_data("addition", 200, 7);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, make_task_data("addition", 200, 8));
  for (const auto& line : a) {
    auto j = nlohmann::json::parse(line);
    std::string p = j["prompt"];
    int64_t x = std::stoll(p.substr(0, p.find('+'))), y = std::stoll(p.substr(p.find('+') + 1));
    std::string sum = std::to_string(x + y);
    EXPECT_EQ(j["label"], std::string(sum.rbegin(), sum.rend()));
    EXPECT_EQ(j["response"], j["label"]);
    EXPECT_LT(x, 1000);
    EXPECT_EQ(exact_match_reward(j["response"], j["label"]), 1.0f);
  }
  for (const auto& line : make_task_data("multiplication", 50, 1)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_NE(std::string(j["prompt"]).find('*'), std::string::npos);
  }
  // Every countdown record's own expression solves it under the countdown verifier.
  for (const auto& line : make_task_data("countdown", 200, 3)) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(countdown_reward(j["response"], j["label"]), 1.0f) << line;
  }
  EXPECT_THROW(make_task_data("sorting", 5, 1), Error);
}

// The coding task's split: `coding` and `coding_heldout` draw from disjoint (A, B) pairs
// (72 and 18 of the 90), every pair of each split turns up, and each record's visible and
// hidden cases are values of its own f(x) = x*A + B, the visible ones written as test.py's
// expressions, the solution in the response.
TEST(MakeData, CodingSplitsArePartsOfOnePairSpace) {
  std::set<std::pair<int64_t, int64_t>> seen[2];
  for (int held_out = 0; held_out < 2; ++held_out)
    for (const auto& line : make_task_data(held_out ? "coding_heldout" : "coding", 1000, 5)) {
      auto j = nlohmann::json::parse(line);
      auto label = nlohmann::json::parse(std::string(j["label"]));
      const int64_t b = label["hidden"][0][1], a = int64_t(label["hidden"][1][1]) - b;  // f(0), f(1) - f(0)
      ASSERT_EQ(label["hidden"][0][0], 0);
      ASSERT_EQ(label["hidden"][1][0], 1);
      EXPECT_TRUE(a >= 1 && a <= 9 && b >= 0 && b <= 9) << line;
      EXPECT_EQ((a + b) % 5 == 0, held_out == 1) << line;
      seen[held_out].insert({a, b});
      for (const auto& c : label["hidden"]) EXPECT_EQ(int64_t(c[1]), int64_t(c[0]) * a + b) << line;
      for (const auto& c : label["visible"]) {
        EXPECT_EQ(int64_t(c[1]), int64_t(c[0]) * a + b) << line;
        EXPECT_EQ(std::string(c[2]), fmt::format("{}*{}+{}", int64_t(c[0]), a, b));
      }
      EXPECT_NE(std::string(j["response"]).find(fmt::format("return x*{}+{}", a, b)), std::string::npos) << line;
    }
  EXPECT_EQ(seen[0].size(), 72u);
  EXPECT_EQ(seen[1].size(), 18u);
}

TEST(PromptSource, SlicesShufflesPerEpochAndKeepsACursor) {
  std::vector<std::string> lines;
  for (int i = 0; i < 10; ++i) lines.push_back(nlohmann::json{{"q", std::to_string(i)}, {"a", "x"}}.dump());
  const std::string path = write_file("slimpi_prompts.jsonl", lines);
  PromptSource all({path, "q", "a", "", false}, 1);
  EXPECT_EQ(all.size(), 10u);
  PromptSource slice({path + "@[2:5]", "q", "a", "", false}, 1);
  ASSERT_EQ(slice.size(), 3u);
  EXPECT_EQ(slice.records()[0].text, "2");
  EXPECT_EQ(PromptSource({path + "@[-3:]", "q", "a", "", false}, 1).records()[0].text, "7");
  // Each epoch visits every record once; epochs are shuffled differently.
  std::vector<Prompt> e0 = all.next(10), e1 = all.next(10);
  std::set<std::string> seen;
  for (const auto& p : e0) seen.insert(p.text);
  EXPECT_EQ(seen.size(), 10u);
  bool differ = false;
  for (size_t i = 0; i < 10; ++i) differ |= e0[i].text != e1[i].text;
  EXPECT_TRUE(differ);
  EXPECT_EQ(all.cursor(), 20);
  EXPECT_EQ(all.epoch(), 2);
  // The cursor is the whole state: a fresh source set to it continues identically.
  PromptSource again({path, "q", "a", "", false}, 1);
  again.set_cursor(13);
  all.set_cursor(13);
  EXPECT_EQ(again.next(4)[3].text, all.next(4)[3].text);
  EXPECT_THROW(PromptSource({path + "@[5:5]", "q", "a", "", false}, 1), Error);
  EXPECT_THROW(PromptSource({path + "@[x:y]", "q", "a", "", false}, 1), Error);
}

TEST(PromptSource, BadLinesStopOrAreSkippedAndCounted) {
  const std::string path = write_file("slimpi_bad_prompts.jsonl",
                                      {R"({"q": "1", "a": "x"})", "not json", R"({"q": "3"})", R"({"q": "4", "a": "y"})"});
  try {
    PromptSource s({path, "q", "a", "", false}, 1);
    FAIL() << "accepted a malformed line";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ":2: not valid JSON");
    EXPECT_TRUE(e.collective());
  }
  PromptSource skip({path, "q", "a", "", true}, 1);
  EXPECT_EQ(skip.size(), 2u);
  EXPECT_EQ(skip.n_skipped_lines(), 2);
}

TEST(PassAtK, UnbiasedEstimator) {
  EXPECT_DOUBLE_EQ(pass_at_k(8, 0, 1), 0.0);
  EXPECT_DOUBLE_EQ(pass_at_k(8, 8, 4), 1.0);
  EXPECT_NEAR(pass_at_k(8, 2, 1), 0.25, 1e-12);
  // 1 - C(6,4)/C(8,4) = 1 - 15/70
  EXPECT_NEAR(pass_at_k(8, 2, 4), 1.0 - 15.0 / 70.0, 1e-12);
  EXPECT_DOUBLE_EQ(pass_at_k(8, 5, 4), 1.0);  // fewer than k wrong samples
}

TEST(SampleCodec, EveryFieldRoundTrips) {
  Sample s;
  s.step = 7;
  s.group_index = 3;
  s.index = 1;
  s.status = SampleStatus::Truncated;
  s.tokens = {257, 1, 2, 3, 258};
  s.prompt_length = 3;
  s.rollout_log_probs = {-0.1f, -2.0f};
  s.sampling_support = {3, 0};
  s.weight_versions = {4, 5};
  s.context_starts = {1};
  s.raw_reward = 1.0f;
  s.reward = 0.5f;
  s.loss_mask = {1.0f, 0.0f};
  s.old_log_probs = {-0.2f, -2.5f};
  s.ref_log_probs = {-0.3f, -2.25f};
  s.kl = {0.1f, -0.25f};
  s.raw_advantages = {0.5f, 0.5f};
  s.advantages = {0.75f, -0.25f};
  Sample empty;
  const std::vector<Sample> back = decode_samples(encode_samples({s, empty, s}));
  ASSERT_EQ(back.size(), 3u);
  const Sample& b = back[2];
  EXPECT_EQ(b.step, s.step);
  EXPECT_EQ(b.group_index, s.group_index);
  EXPECT_EQ(b.index, s.index);
  EXPECT_EQ(b.status, s.status);
  EXPECT_EQ(b.tokens, s.tokens);
  EXPECT_EQ(b.prompt_length, s.prompt_length);
  EXPECT_EQ(b.rollout_log_probs, s.rollout_log_probs);
  EXPECT_EQ(b.sampling_support, s.sampling_support);
  EXPECT_EQ(b.weight_versions, s.weight_versions);
  EXPECT_EQ(b.context_starts, s.context_starts);
  EXPECT_EQ(b.raw_reward, s.raw_reward);
  EXPECT_EQ(b.reward, s.reward);
  EXPECT_EQ(b.loss_mask, s.loss_mask);
  EXPECT_EQ(b.old_log_probs, s.old_log_probs);
  EXPECT_EQ(b.ref_log_probs, s.ref_log_probs);
  EXPECT_EQ(b.kl, s.kl);
  EXPECT_EQ(b.raw_advantages, s.raw_advantages);
  EXPECT_EQ(b.advantages, s.advantages);
  EXPECT_TRUE(back[1].tokens.empty() && back[1].advantages.empty());
  std::string bytes = encode_samples({s});
  bytes.pop_back();
  EXPECT_THROW(decode_samples(bytes), Error);  // a truncated message is an error, not garbage
}

}  // namespace
}  // namespace slimpi
