// exact_match, math and f1 (see reward/reward.h for their definitions).
#include <cctype>
#include <map>
#include <optional>
#include <regex>
#include <sstream>

#include "reward/rational.h"
#include "reward/reward.h"

namespace slimpi {
namespace {

std::string collapse_whitespace(const std::string& s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      space = !out.empty();
    } else {
      if (space) out += ' ';
      out += c;
      space = false;
    }
  }
  return out;
}

// The content of the last \boxed{...}, braces balanced; nullopt if there is none.
std::optional<std::string> last_boxed(const std::string& s) {
  size_t at = s.rfind("\\boxed{");
  if (at == std::string::npos) return std::nullopt;
  size_t i = at + 7;
  int depth = 1;
  std::string out;
  for (; i < s.size() && depth > 0; ++i) {
    if (s[i] == '{') ++depth;
    if (s[i] == '}' && --depth == 0) break;
    out += s[i];
  }
  if (depth != 0) return std::nullopt;
  return out;
}

// The last number-like token: -1, 3.5, .50, 1/2, 1,000.
std::optional<std::string> last_number(const std::string& s) {
  static const std::regex number(R"([-+]?(\d[\d,]*)?\.?\d+(/\d+)?)");
  std::optional<std::string> last;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), number); it != std::sregex_iterator(); ++it)
    last = it->str();
  return last;
}

std::vector<std::string> squad_tokens(const std::string& s) {
  std::string clean;
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (std::ispunct(u)) continue;
    clean += static_cast<char>(std::tolower(u));
  }
  std::istringstream in(clean);
  std::vector<std::string> out;
  for (std::string w; in >> w;)
    if (w != "a" && w != "an" && w != "the") out.push_back(w);
  return out;
}

}  // namespace

float exact_match_reward(const std::string& response, const std::string& label) {
  return collapse_whitespace(response) == collapse_whitespace(label) ? 1.0f : 0.0f;
}

float math_reward(const std::string& response, const std::string& label) {
  std::optional<std::string> answer = last_boxed(response);
  if (!answer) answer = last_number(response);
  if (!answer) return 0.0f;
  std::optional<Rational> got = parse_rational(collapse_whitespace(*answer));
  std::optional<Rational> want = parse_rational(collapse_whitespace(label));
  if (got && want) return *got == *want ? 1.0f : 0.0f;
  return collapse_whitespace(*answer) == collapse_whitespace(label) ? 1.0f : 0.0f;
}

float f1_reward(const std::string& response, const std::string& label) {
  std::vector<std::string> pred = squad_tokens(response), gold = squad_tokens(label);
  if (pred.empty() || gold.empty()) return pred.empty() && gold.empty() ? 1.0f : 0.0f;
  std::map<std::string, int> counts;
  for (const auto& w : gold) ++counts[w];
  int common = 0;
  for (const auto& w : pred)
    if (counts[w]-- > 0) ++common;
  if (common == 0) return 0.0f;
  const double precision = double(common) / pred.size(), recall = double(common) / gold.size();
  return static_cast<float>(2 * precision * recall / (precision + recall));
}

}  // namespace slimpi
