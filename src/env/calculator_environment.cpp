#include "env/calculator_environment.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <deque>
#include <map>

namespace slimpi {
namespace {

constexpr __int128 kLimit = static_cast<__int128>(1000000000000000000LL);  // 10^18

// Recursive descent over "expr := term (+|- term)*, term := factor (* factor)*,
// factor := digits | ( expr ) | - factor"; errors are thrown as their text.
class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}
  __int128 parse() {
    const __int128 v = expr();
    skip();
    if (i_ < s_.size()) throw fmt::format("unexpected character at {}", i_);
    return v;
  }

 private:
  void skip() {
    while (i_ < s_.size() && s_[i_] == ' ') ++i_;
  }
  static __int128 checked(__int128 v) {
    if (v > kLimit || v < -kLimit) throw std::string("overflow");
    return v;
  }
  __int128 expr() {
    __int128 v = term();
    for (skip(); i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-'); skip()) {
      const char op = s_[i_++];
      const __int128 w = term();
      v = checked(op == '+' ? v + w : v - w);
    }
    return v;
  }
  __int128 term() {
    __int128 v = factor();
    for (skip(); i_ < s_.size() && s_[i_] == '*'; skip()) {
      ++i_;
      v = checked(v * factor());
    }
    return v;
  }
  __int128 factor() {
    skip();
    if (i_ >= s_.size()) throw std::string("unexpected end");
    const char c = s_[i_];
    if (c == '-') {
      ++i_;
      return checked(-factor());
    }
    if (c == '(') {
      ++i_;
      const __int128 v = expr();
      skip();
      if (i_ >= s_.size() || s_[i_] != ')') throw i_ >= s_.size() ? std::string("unexpected end") : fmt::format("unexpected character at {}", i_);
      ++i_;
      return v;
    }
    if (c < '0' || c > '9') throw fmt::format("unexpected character at {}", i_);
    __int128 v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') v = checked(v * 10 + (s_[i_++] - '0'));
    return v;
  }
  const std::string& s_;
  size_t i_ = 0;
};

std::string to_text(__int128 v) {
  if (v == 0) return "0";
  const bool negative = v < 0;
  std::string out;
  for (__int128 x = negative ? -v : v; x > 0; x /= 10) out.insert(out.begin(), char('0' + int(x % 10)));
  return negative ? "-" + out : out;
}

std::string strip(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

// The in-process environment: replies are ready at once.
class CalculatorEnvironment : public Environment {
 public:
  CalculatorEnvironment() {
    info_.protocol_version = 1;
    info_.name = "calculator";
    info_.tools_json =
        R"([{"type":"function","function":{"name":"calculator","description":"integer + - * and parentheses",)"
        R"("parameters":{"type":"object","properties":{"expression":{"type":"string"}},"required":["expression"]}}}])";
    info_.max_concurrent_episodes = 1 << 20;
    info_.deterministic = true;
  }
  const EnvInfo& info() const override { return info_; }
  void reset(const EpisodeStart& s) override {
    open_[s.episode] = {s.label, s.max_turns};
    EnvReply r;
    r.episode = s.episode;
    ready_.push_back(r);
  }
  void step(const EpisodeAction& a) override {
    const auto& [label, max_turns] = open_.at(a.episode);
    ready_.push_back(calculator_step(a, max_turns, label));
  }
  void close(const std::string& episode) override { open_.erase(episode); }
  std::vector<EnvReply> poll(double) override {
    std::vector<EnvReply> out(ready_.begin(), ready_.end());
    ready_.clear();
    return out;
  }
  int64_t capacity() const override { return info_.max_concurrent_episodes; }

 private:
  EnvInfo info_;
  std::map<std::string, std::pair<std::string, int64_t>> open_;  // episode -> label, max turns
  std::deque<EnvReply> ready_;
};

}  // namespace

std::string calculate(const std::string& expression) {
  if (expression.size() > 200) return "error: longer than 200 characters";
  try {
    return to_text(Parser(expression).parse());
  } catch (const std::string& why) {
    return "error: " + why;
  }
}

EnvReply calculator_step(const EpisodeAction& action, int64_t max_turns, const std::string& label) {
  EnvReply r;
  r.episode = action.episode;
  if (action.tool_calls.empty()) {
    r.reward = strip(action.text) == strip(label) ? 1.0 : 0.0;
    r.done = true;
    return r;
  }
  for (const ToolCall& call : action.tool_calls) {
    std::string result;
    if (!call.error.empty()) {
      result = "error: " + call.error;
    } else if (call.name != "calculator") {
      result = "error: unknown tool " + call.name;
    } else {
      const nlohmann::json args = nlohmann::json::parse(call.arguments_json, nullptr, false);
      if (!args.is_object() || !args.contains("expression") || !args["expression"].is_string())
        result = "error: arguments need a string \"expression\"";
      else
        result = calculate(args["expression"].get<std::string>());
    }
    if (result.rfind("error: ", 0) == 0) {
      r.error = EnvError::Tool;
      r.message = result;
    }
    r.messages.push_back({"tool", result, false, ""});
  }
  r.truncated = action.turn >= max_turns;
  return r;
}

std::unique_ptr<Environment> make_calculator_environment() { return std::make_unique<CalculatorEnvironment>(); }

}  // namespace slimpi
