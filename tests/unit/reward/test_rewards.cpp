// Reward styles on hand-written cases, hostile countdown expressions, and the
// command style's time-out and bad answers.
#include <gtest/gtest.h>
#include <slimpi/error.h>

#include "reward/rational.h"
#include "reward/reward.h"

namespace slimpi {
namespace {

TEST(Rewards, ExactMatchNormalisesWhitespaceOnly) {
  EXPECT_EQ(exact_match_reward(" 57 ", "57"), 1.0f);
  EXPECT_EQ(exact_match_reward("new  york\n", "new york"), 1.0f);
  EXPECT_EQ(exact_match_reward("57", "75"), 0.0f);
  EXPECT_EQ(exact_match_reward("Paris", "paris"), 0.0f);
}

TEST(Rewards, MathComparesExactValues) {
  EXPECT_EQ(math_reward("so the answer is \\boxed{1/2}", "0.5"), 1.0f);
  EXPECT_EQ(math_reward("the result: .50", "1/2"), 1.0f);
  EXPECT_EQ(math_reward("first 3 then 7", "7"), 1.0f);  // last number
  EXPECT_EQ(math_reward("\\boxed{\\frac{1}{2}} or 0.5", "0.5"), 1.0f - 1.0f);  // boxed wins; not a number
  EXPECT_EQ(math_reward("\\boxed{-3}", "-3.0"), 1.0f);
  EXPECT_EQ(math_reward("1,000 apples", "1000"), 1.0f);
  EXPECT_EQ(math_reward("0.3333", "1/3"), 0.0f);
  EXPECT_EQ(math_reward("no number here", "4"), 0.0f);
  EXPECT_EQ(math_reward("\\boxed{x+1}", "x+1"), 1.0f);  // non-numeric: string equality
}

TEST(Rewards, RationalsAreExactAndRefuseOverflow) {
  EXPECT_EQ(*parse_rational("0.25"), (Rational{1, 4}));
  EXPECT_EQ(*parse_rational("-6/8"), (Rational{-3, 4}));
  EXPECT_FALSE(parse_rational("1/0"));
  EXPECT_FALSE(parse_rational("abc"));
  EXPECT_FALSE(parse_rational("99999999999999999999"));
  EXPECT_FALSE(mul(Rational{INT64_MAX / 2, 1}, Rational{3, 1}));
}

TEST(Rewards, CountdownUsesEachNumberOnceAndHitsTheTarget) {
  const std::string label = R"({"target": 24, "numbers": [4, 6, 1, 1]})";
  EXPECT_EQ(countdown_reward("<answer>4 * 6 * 1 * 1</answer>", label), 1.0f);
  EXPECT_EQ(countdown_reward("thinking...\n(4*6)/(1*1) = 24", label), 1.0f);
  EXPECT_EQ(countdown_reward("<answer>4 * 6</answer>", label), 0.0f);             // numbers unused
  EXPECT_EQ(countdown_reward("<answer>4*6*1*1*1</answer>", label), 0.0f);         // a number twice
  EXPECT_EQ(countdown_reward("<answer>4 + 6 + 1 + 1</answer>", label), 0.0f);     // wrong value
  EXPECT_EQ(countdown_reward("<answer>(6 - 4/1) * 12 / 1</answer>", label), 0.0f);  // 12 is not given
}

TEST(Rewards, CountdownSurvivesHostileExpressions) {
  const std::string label = R"({"target": 2, "numbers": [1, 1]})";
  for (const std::string& hostile :
       {std::string("<answer>1/(1-1)</answer>"), std::string("<answer>") + std::string(100000, '(') + "1+1",
        std::string("<answer>") + std::string(40, '(') + "1+1" + std::string(40, ')') + "</answer>",
        std::string("<answer>999999999999999999999*1</answer>"), std::string("<answer>__import__('os')</answer>"),
        std::string("<answer>1+</answer>"), std::string("<answer>)1+1(</answer>"), std::string("<answer></answer>"),
        std::string("<answer>1 1</answer>"), std::string("\x00\xff\x01", 3), std::string("<answer>-1+-1</answer>"),
        std::string("<answer>") + std::string(300, '1') + "</answer>"}) {
    EXPECT_EQ(countdown_reward(hostile, label), 0.0f) << hostile.substr(0, 40);
  }
  for (const std::string& bad_label : {"", "{", "[]", R"({"target": "2", "numbers": [1]})", R"({"target": 2})"})
    EXPECT_EQ(countdown_reward("<answer>1+1</answer>", bad_label), 0.0f);
  EXPECT_EQ(countdown_reward("<answer>1+1</answer>", label), 1.0f);
  // Intermediate products beyond 64 bits are refused, not wrapped.
  EXPECT_EQ(countdown_reward("<answer>999999999*999999999*999999999/999999999/999999999</answer>",
                             R"({"target": 999999999, "numbers": [999999999, 999999999, 999999999, 999999999, 999999999]})"),
            0.0f);
}

TEST(Rewards, F1IsSquadTokenF1) {
  EXPECT_NEAR(f1_reward("The Eiffel Tower", "eiffel tower"), 1.0f, 1e-6);
  EXPECT_NEAR(f1_reward("in Paris, France", "Paris"), 2 * (1.0 / 3) * 1.0 / (1.0 / 3 + 1.0), 1e-6);
  EXPECT_EQ(f1_reward("London", "Paris"), 0.0f);
}

TEST(Rewards, RegistryAndBatch) {
  RewardConfig cfg;
  cfg.style = "math";
  auto r = compute_rewards(cfg, {{"p", "\\boxed{2}", "2"}, {"p", "3", "2"}});
  EXPECT_EQ(r, (std::vector<float>{1.0f, 0.0f}));
  cfg.style = "nope";
  try {
    compute_rewards(cfg, {{"p", "r", "l"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("valid: command, countdown, environment, exact_match, f1, math"), std::string::npos)
        << e.what();
  }
}

TEST(Rewards, CommandStyleReadsOneNumberPerLine) {
  RewardConfig cfg;
  cfg.style = "command";
  // Scores the response length via python-free shell tools: one line per JSON line.
  cfg.command = "while IFS= read -r line; do case \"$line\" in *'\"response\": \"yes\"'*|*'\"response\":\"yes\"'*) echo 1;; *) echo 0.25;; esac; done";
  cfg.command_timeout_s = 20;
  std::vector<RewardInput> batch{{"q", "yes", "l"}, {"q", "no", "l"}, {"q", "yes", "l"}, {"q", "\x86\xff", "l"}};
  EXPECT_EQ(compute_rewards(cfg, batch), (std::vector<float>{1.0f, 0.25f, 1.0f, 0.25f}));  // invalid UTF-8 is fine
}

// reward.command_max_stderr_bytes: a command that writes ~0.7 MB to stderr (more than a
// pipe holds) before its numbers still answers; the log gets its first lines up to the
// cap, one line saying the rest is dropped, and its last lines.
TEST(Rewards, CommandStderrIsLoggedWithinItsCap) {
  RewardConfig cfg;
  cfg.style = "command";
  cfg.command = "i=0; while [ $i -lt 20000 ]; do echo \"reward noise $i of a chatty command\" >&2; i=$((i+1)); done; "
                "cat >/dev/null; echo 1; echo 0; echo 'reward last words' >&2";
  cfg.command_timeout_s = 30;
  cfg.command_max_stderr_bytes = 500;
  std::vector<RewardInput> batch{{"q", "a", "l"}, {"q", "b", "l"}};
  ::testing::internal::CaptureStderr();
  const std::vector<float> r = compute_rewards(cfg, batch);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(r, (std::vector<float>{1.0f, 0.0f}));
  EXPECT_NE(log.find("[reward.command stderr] reward noise 0 of a chatty command"), std::string::npos) << log;
  EXPECT_NE(log.find("more than reward.command_max_stderr_bytes = 500 bytes"), std::string::npos) << log;
  EXPECT_NE(log.find("[reward.command stderr, last lines] reward last words"), std::string::npos) << log;
  EXPECT_EQ(log.find("reward noise 100 "), std::string::npos) << "lines past the cap were logged";
  EXPECT_LT(log.size(), 12000u);
}

TEST(Rewards, CommandTimeOutAndBadAnswersNameTheSample) {
  RewardConfig cfg;
  cfg.style = "command";
  std::vector<RewardInput> batch{{"q", "first answer", "l"}, {"q", "second answer", "l"}};
  auto error_of = [&](const std::string& command, double timeout) {
    cfg.command = command;
    cfg.command_timeout_s = timeout;
    try {
      compute_rewards(cfg, batch);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string t = error_of("read x; echo 1; sleep 30", 0.5);
  EXPECT_NE(t.find("timed out after 0.5 s"), std::string::npos) << t;
  EXPECT_NE(t.find("sample 1 of 2 (response \"second answer\")"), std::string::npos) << t;
  std::string bad = error_of("cat >/dev/null; echo 1; echo high", 10);
  EXPECT_NE(bad.find("answered \"high\" for sample 1 of 2"), std::string::npos) << bad;
  std::string few = error_of("cat >/dev/null; echo 1", 10);
  EXPECT_NE(few.find("gave 1 numbers for 2 samples"), std::string::npos) << few;
  std::string failed = error_of("exit 3", 10);
  EXPECT_NE(failed.find("exit status 3"), std::string::npos) << failed;
  // After every sample has its number, messages say so (not "at after the last of 2").
  std::string many = error_of("cat >/dev/null; echo 1; echo 1; echo 1", 10);
  EXPECT_NE(many.find("gave 3 numbers for 2 samples: 1 more than samples"), std::string::npos) << many;
  std::string late = error_of("cat >/dev/null; echo 1; echo 1; exit 4", 10);
  EXPECT_NE(late.find("failed (exit status 4) after answering all 2 samples"), std::string::npos) << late;
  std::string extra = error_of("cat >/dev/null; echo 1; echo 1; echo done", 10);
  EXPECT_NE(extra.find("answered \"done\" after all 2 samples had their number"), std::string::npos) << extra;
  // The command gets the default SIGPIPE back (the rank ignores it; execve would keep
  // that): bit 12 of SigIgn (signal 13) must be clear.
  cfg.command = "cat >/dev/null; m=$(awk '/^SigIgn/{print $2}' /proc/$$/status); "
                "if [ $(( 0x$m & 0x1000 )) -ne 0 ]; then echo 0; echo 0; else echo 1; echo 1; fi";
  cfg.command_timeout_s = 10;
  EXPECT_EQ(compute_rewards(cfg, batch), (std::vector<float>{1.0f, 1.0f}));
}

}  // namespace
}  // namespace slimpi
