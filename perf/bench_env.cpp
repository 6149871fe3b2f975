// The cost of the environment protocol per turn (docs/environments.md): one step of a
// calculator episode (a tool call evaluated, its reply parsed), measured as
//   BM_EnvStep/native       the in-process calculator (rollout.environment = "calculator")
//   BM_EnvStep/python/<k>   inputs/envs/calculator.py through a pipe (rollout.environment =
//                           "command"), k episodes in flight (their steps sent together, the
//                           replies collected): JSON encode, the pipe both ways, the
//                           Python side, the reply's validation
// Counter us_per_turn: wall microseconds per step. Run: build/perf/bench_env
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>
#include <vector>

#include "env/calculator_environment.h"
#include "env/command_environment.h"

namespace slimpi::perf {
namespace {

std::unique_ptr<Environment> make(bool python) {
  if (!python) return make_calculator_environment();
  EnvConfig cfg;
  cfg.name = "command";
  cfg.command = std::string("python3 ") + SLIMPI_SOURCE_DIR + "/inputs/envs/calculator.py";
  return std::make_unique<CommandEnvironment>(cfg, 300);
}

void run_steps(benchmark::State& state, bool python) {
  const int64_t k = state.range(0);
  auto env = make(python);
  std::vector<std::string> ids;
  for (int64_t i = 0; i < k; ++i) {
    EpisodeStart s;
    s.episode = "0/" + std::to_string(i) + "/0";
    s.label = "5535";
    s.max_turns = 1 << 30;
    env->reset(s);
    ids.push_back(s.episode);
  }
  for (size_t got = 0; got < ids.size();) got += env->poll(0.01).size();
  const std::string text = R"(<tool_call>{"name": "calculator", "arguments": {"expression": "123*45"}}</tool_call>)";
  int64_t turn = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    ++turn;
    for (const std::string& id : ids) {
      EpisodeAction a;
      a.episode = id;
      a.turn = turn;
      a.text = text;
      a.tool_calls = parse_tool_calls(text, ChatTemplate::ChatML);
      a.finish_reason = "stop";
      env->step(a);
    }
    for (size_t got = 0; got < ids.size();) got += env->poll(0.001).size();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  state.counters["us_per_turn"] = 1e6 * seconds / double(state.iterations() * k);
}

void BM_EnvStepNative(benchmark::State& state) { run_steps(state, false); }
void BM_EnvStepPython(benchmark::State& state) { run_steps(state, true); }
BENCHMARK(BM_EnvStepNative)->Name("BM_EnvStep/native")->Arg(1)->Arg(64)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EnvStepPython)->Name("BM_EnvStep/python")->Arg(1)->Arg(64)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace slimpi::perf
