// Encoding speed of a Hugging Face byte-level BPE tokenizer (tokenizer/bpe_tokenizer.h):
//   BM_BpeEncode  encodes the lines of $SLIMPI_TOKENIZER_TEXT (a UTF-8 file) with the
//                 tokenizer.json in $SLIMPI_TOKENIZER (default: the qwen2-style
//                 fixture), one line at a time, one thread. Counter MB_per_s.
// perf/tokenizer_speed.sh runs it next to the Python `tokenizers` library on the same
// text and prints the ratio. Run: build/perf/bench_tokenizer
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tokenizer/bpe_tokenizer.h"

namespace slimpi::perf {
namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

void BM_BpeEncode(benchmark::State& state) {
  const std::string fixture = std::string(SLIMPI_SOURCE_DIR) + "/tests/fixtures/tokenizers/qwen2_style";
  BpeTokenizer tok(env_or("SLIMPI_TOKENIZER", fixture));
  std::vector<std::string> lines;
  std::ifstream in(env_or("SLIMPI_TOKENIZER_TEXT", std::string(SLIMPI_SOURCE_DIR) + "/README.md"));
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  int64_t bytes = 0, tokens = 0;
  for (const auto& l : lines) bytes += int64_t(l.size());
  for (auto _ : state)
    for (const auto& l : lines) tokens += int64_t(tok.encode(l).size());
  state.counters["MB_per_s"] = benchmark::Counter(double(bytes) * double(state.iterations()) / 1e6,
                                                  benchmark::Counter::kIsRate);
  state.counters["tokens"] = double(tokens) / double(state.iterations());
}
BENCHMARK(BM_BpeEncode)->Iterations(3)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace slimpi::perf
