#include "cli/make_data.h"

#include <slimpi/error.h>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "core/registry.h"
#include "kernels/counter_rng.h"

namespace slimpi {
namespace {

// Draw `field` of record `i`: uniform in [lo, hi] (modulo bias < 2^-40 for these ranges).
int64_t draw(uint64_t seed, int64_t i, uint64_t field, int64_t lo, int64_t hi) {
  return lo + int64_t(mix_seed(seed, uint64_t(i), field) % uint64_t(hi - lo + 1));
}

int64_t pow10(int64_t k) {
  int64_t p = 1;
  while (k-- > 0) p *= 10;
  return p;
}

std::string reversed(int64_t v) {
  std::string s = std::to_string(v);
  std::reverse(s.begin(), s.end());
  return s;
}

std::string arithmetic_line(const std::string& op, int64_t a, int64_t b, int64_t result) {
  const std::string answer = reversed(result);
  return nlohmann::json{{"prompt", fmt::format("{}{}{}=", a, op, b)}, {"response", answer}, {"label", answer}}.dump();
}

std::string countdown_line(uint64_t seed, int64_t i) {
  const int64_t count = draw(seed, i, 0, 3, 4);
  std::vector<int64_t> numbers;
  for (int64_t k = 0; k < count; ++k) numbers.push_back(draw(seed, i, 1 + k, 1, 20));
  // The target: numbers combined left to right with random + - * (kept positive).
  int64_t target = numbers[0];
  std::string expression = std::to_string(numbers[0]);
  for (int64_t k = 1; k < count; ++k) {
    const int64_t op = draw(seed, i, 10 + k, 0, 2), x = numbers[k];
    if (op == 0 || (op == 1 && target - x <= 0)) {
      target += x;
      expression = fmt::format("({} + {})", expression, x);
    } else if (op == 1) {
      target -= x;
      expression = fmt::format("({} - {})", expression, x);
    } else {
      target *= x;
      expression = fmt::format("({} * {})", expression, x);
    }
  }
  nlohmann::json label{{"target", target}, {"numbers", numbers}};
  const std::string prompt = fmt::format("Using the numbers [{}] once each with + - * /, make {}. Answer with the expression.",
                                         fmt::join(numbers, ", "), target);
  return nlohmann::json{{"prompt", prompt}, {"response", expression}, {"label", label.dump()}}.dump();
}

// One line of task data: record i of the draws of `seed`.
using TaskLine = std::string (*)(uint64_t seed, int64_t i);

std::string addition_line(uint64_t seed, int64_t i) {
  const int64_t a = draw(seed, i, 1, 0, pow10(draw(seed, i, 0, 1, 3)) - 1);
  const int64_t b = draw(seed, i, 3, 0, pow10(draw(seed, i, 2, 1, 3)) - 1);
  return arithmetic_line("+", a, b, a + b);
}

std::string multiplication_line(uint64_t seed, int64_t i) {
  const int64_t a = draw(seed, i, 1, 0, pow10(draw(seed, i, 0, 1, 2)) - 1);
  const int64_t b = draw(seed, i, 3, 0, pow10(draw(seed, i, 2, 1, 2)) - 1);
  return arithmetic_line("*", a, b, a * b);
}

// Multiplication of two 2-3 digit numbers with the calculator tool (rollout.environment =
// "calculator", template none): the response is the whole episode as the engine's token
// stream holds it, a tool call, the environment's tool response, the product copied from
// it; label the product. SFT on it teaches the format (and trains on the tool's reply too:
// SFT data has no loss mask); RL then rewards the episodes whose answer is right.
std::string tool_multiplication_line(uint64_t seed, int64_t i) {
  const int64_t a = draw(seed, i, 1, 10, pow10(draw(seed, i, 0, 2, 3)) - 1);
  const int64_t b = draw(seed, i, 3, 10, pow10(draw(seed, i, 2, 2, 3)) - 1);
  const std::string product = std::to_string(a * b);
  const std::string call = fmt::format(
      R"(<tool_call>{{"name":"calculator","arguments":{{"expression":"{}*{}"}}}}</tool_call>)", a, b);
  const std::string response = call + "<tool_response>\n" + product + "\n</tool_response>\n" + product;
  return nlohmann::json{{"prompt", fmt::format("{}*{}=", a, b)}, {"response", response}, {"label", product}}.dump();
}

// The coding agent's task (inputs/agents/coding_agent.py, docs/agents.md): make test.py
// pass by writing f(x) = x*A + B in sol.py, A in 1..9, B in 0..9. test.py checks f(1) and f(2)
// against expected values written as expressions (`assert f(2)==2*A+B`), so both constants
// are there to copy, each after the operator it follows in the solution: a skill that
// carries over to pairs never seen. The reward is the fraction of hidden cases
// (x = 0, 1, 2, 3, 10) that the final sol.py passes. The 18 pairs with (A + B) % 5 == 0
// are held out: `coding` draws from the other 72, `coding_heldout` from those 18 only. The
// response is the whole episode as the engine's token stream holds it under chat template
// none: the prompt's newline, then read_file, write_file and run_tests (each call, the
// agent's tool output), then "done"; the tool outputs are coding_agent.py's, byte for byte.
bool coding_pair_held_out(int64_t a, int64_t b) { return (a + b) % 5 == 0; }

std::string coding_task(uint64_t seed, int64_t i, bool held_out) {
  std::vector<std::pair<int64_t, int64_t>> pairs;  // (A, B) of the split, in a fixed order
  for (int64_t a = 1; a <= 9; ++a)
    for (int64_t b = 0; b <= 9; ++b)
      if (coding_pair_held_out(a, b) == held_out) pairs.emplace_back(a, b);
  const auto [a, b] = pairs[size_t(draw(seed, i, 0, 0, int64_t(pairs.size()) - 1))];
  auto f = [&](int64_t x) { return a * x + b; };
  nlohmann::json visible = nlohmann::json::array(), hidden = nlohmann::json::array();
  std::string tests;
  for (int64_t x : {1, 2}) {
    const std::string expected = fmt::format("{}*{}+{}", x, a, b);
    visible.push_back({x, f(x), expected});
    tests += fmt::format("assert f({})=={}\n", x, expected);
  }
  for (int64_t x : {0, 1, 2, 3, 10}) hidden.push_back({x, f(x)});
  using ojson = nlohmann::ordered_json;
  auto call = [](const std::string& name, const ojson& args) {
    return "<tool_call>" + ojson{{"name", name}, {"arguments", args}}.dump() + "</tool_call>";
  };
  auto output = [](const std::string& text) { return "<tool_response>\n" + text + "\n</tool_response>\n"; };
  const std::string response =
      "\n" + call("read_file", ojson{{"path", "test.py"}}) + output(tests) +
      call("write_file", ojson{{"content", fmt::format("def f(x):return x*{}+{}", a, b)}, {"path", "sol.py"}}) +
      output("wrote sol.py") + call("run_tests", ojson::object()) + output("2/2 passed") + "done";
  return nlohmann::json{{"prompt", "Make test.py pass."},
                        {"response", response},
                        {"label", nlohmann::json{{"visible", visible}, {"hidden", hidden}}.dump()}}
      .dump();
}

std::string coding_line(uint64_t seed, int64_t i) { return coding_task(seed, i, false); }
std::string coding_heldout_line(uint64_t seed, int64_t i) { return coding_task(seed, i, true); }

const Registry<TaskLine>& task_lines() {
  static const Registry<TaskLine> r(
      "make-data task",
      {{"addition", addition_line}, {"multiplication", multiplication_line}, {"countdown", countdown_line},
       {"tool_multiplication", tool_multiplication_line}, {"coding", coding_line},
       {"coding_heldout", coding_heldout_line}});
  return r;
}

}  // namespace

std::vector<std::string> data_tasks() { return task_lines().names(); }

std::vector<std::string> make_task_data(const std::string& task, int64_t n, uint64_t seed) {
  SLIMPI_CHECK(n >= 1, "make-data: --n must be at least 1, got {}", n);
  if (!task_lines().has(task))
    SLIMPI_FAIL_ALL("make-data: unknown task '{}'; valid: {}", task, fmt::join(data_tasks(), ", "));
  const TaskLine line = task_lines().get(task);
  std::vector<std::string> lines;
  for (int64_t i = 0; i < n; ++i) lines.push_back(line(seed, i));
  return lines;
}

}  // namespace slimpi
