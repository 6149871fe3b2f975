// countdown (see reward/reward.h): a small recursive-descent evaluator over exact
// rationals with hard limits, so that any input - malformed, huge, deeply nested,
// dividing by zero - scores 0 instead of crashing or running long.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <optional>

#include "reward/rational.h"
#include "reward/reward.h"

namespace slimpi {
namespace {

constexpr size_t kMaxExpressionChars = 256;
constexpr int kMaxDepth = 32;

class Evaluator {
 public:
  explicit Evaluator(const std::string& text) : s_(text) {}

  // The value, and the numbers the expression used, if it parses completely.
  std::optional<Rational> evaluate(std::vector<int64_t>& used) {
    auto v = expression(0);
    skip_space();
    if (!v || pos_ != s_.size()) return std::nullopt;
    used = used_;
    return v;
  }

 private:
  void skip_space() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  std::optional<Rational> expression(int depth) {
    if (depth > kMaxDepth) return std::nullopt;
    auto v = term(depth);
    while (v) {
      if (eat('+')) {
        auto r = term(depth);
        v = r ? add(*v, *r) : std::nullopt;
      } else if (eat('-')) {
        auto r = term(depth);
        v = r ? sub(*v, *r) : std::nullopt;
      } else {
        break;
      }
    }
    return v;
  }
  std::optional<Rational> term(int depth) {
    auto v = factor(depth);
    while (v) {
      if (eat('*')) {
        auto r = factor(depth);
        v = r ? mul(*v, *r) : std::nullopt;
      } else if (eat('/')) {
        auto r = factor(depth);
        v = r ? div(*v, *r) : std::nullopt;
      } else {
        break;
      }
    }
    return v;
  }
  std::optional<Rational> factor(int depth) {
    if (eat('(')) {
      auto v = expression(depth + 1);
      if (!v || !eat(')')) return std::nullopt;
      return v;
    }
    skip_space();
    size_t start = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (pos_ == start || pos_ - start > 9) return std::nullopt;
    int64_t n = std::stoll(s_.substr(start, pos_ - start));
    used_.push_back(n);
    return make_rational(n, 1);
  }

  const std::string& s_;
  size_t pos_ = 0;
  std::vector<int64_t> used_;
};

// The expression a response proposes: inside the last <answer>...</answer>, else the
// last non-empty line; an "= value" tail is dropped.
std::string proposed_expression(const std::string& response) {
  std::string text = response;
  size_t open = text.rfind("<answer>");
  if (open != std::string::npos) {
    size_t close = text.find("</answer>", open);
    text = text.substr(open + 8, close == std::string::npos ? std::string::npos : close - open - 8);
  } else {
    size_t end = text.find_last_not_of(" \t\r\n");
    text = end == std::string::npos ? "" : text.substr(0, end + 1);
    size_t nl = text.rfind('\n');
    if (nl != std::string::npos) text = text.substr(nl + 1);
  }
  size_t eq = text.find('=');
  if (eq != std::string::npos) text = text.substr(0, eq);
  return text;
}

}  // namespace

float countdown_reward(const std::string& response, const std::string& label) {
  nlohmann::json spec = nlohmann::json::parse(label, nullptr, /*allow_exceptions=*/false);
  if (!spec.is_object() || !spec.contains("target") || !spec.contains("numbers") || !spec["target"].is_number_integer() ||
      !spec["numbers"].is_array())
    return 0.0f;
  std::vector<int64_t> numbers;
  for (const auto& n : spec["numbers"]) {
    if (!n.is_number_integer()) return 0.0f;
    numbers.push_back(n.get<int64_t>());
  }
  const std::string expression = proposed_expression(response);
  if (expression.empty() || expression.size() > kMaxExpressionChars) return 0.0f;
  std::vector<int64_t> used;
  std::optional<Rational> value = Evaluator(expression).evaluate(used);
  if (!value) return 0.0f;
  std::sort(used.begin(), used.end());
  std::sort(numbers.begin(), numbers.end());
  if (used != numbers) return 0.0f;
  return *value == Rational{spec["target"].get<int64_t>(), 1} ? 1.0f : 0.0f;
}

}  // namespace slimpi
