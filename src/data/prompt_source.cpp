#include "data/prompt_source.h"

#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <stdexcept>

#include "data/jsonl_file.h"
#include "tokenizer/byte_tokenizer.h"

namespace slimpi {

PathSlice parse_path_slice(const std::string& spec) {
  PathSlice s;
  static const std::regex with_slice(R"((.*)@\[(-?\d*):(-?\d*)\])");
  std::smatch m;
  if (!std::regex_match(spec, m, with_slice)) {
    if (spec.find("@[") != std::string::npos)
      SLIMPI_FAIL_ALL("data path '{}': a slice is written file.jsonl@[a:b] with integer bounds", spec);
    s.file = spec;
    return s;
  }
  s.file = m[1];
  auto bound = [&](const std::string& text, int64_t fallback) -> int64_t {
    if (text.empty()) return fallback;
    try {
      return std::stoll(text);
    } catch (const std::out_of_range&) {
      SLIMPI_FAIL_ALL("data path '{}': slice bound {} is out of the 64-bit range", spec, text);
    }
  };
  s.begin = bound(m[2], 0);
  s.end = bound(m[3], INT64_MAX);
  return s;
}

std::pair<int64_t, int64_t> PathSlice::range(int64_t n) const {
  auto clamp_index = [n](int64_t i) { return i < 0 ? std::max<int64_t>(0, n + i) : std::min(i, n); };
  return {clamp_index(begin), end == INT64_MAX ? n : clamp_index(end)};
}

PromptSourceSpec PromptSourceSpec::from_deck(const Deck& deck, const std::string& path,
                                             std::shared_ptr<const Tokenizer> tokenizer) {
  PromptSourceSpec spec;
  spec.path = path;
  spec.input_key = deck.get_string("data.input_key");
  spec.label_key = deck.get_string("data.label_key");
  spec.chat = ChatFormat::from_deck(deck, *tokenizer);
  spec.tokenizer = std::move(tokenizer);
  return spec;
}

PromptSource::PromptSource(const PromptSourceSpec& spec, uint64_t seed) : order_(1, seed) {
  PathSlice slice = parse_path_slice(spec.path);
  std::vector<std::string> keys{spec.input_key, spec.label_key};
  std::vector<std::string> optional;
  if (spec.label_optional) optional.push_back(spec.label_key);
  if (!spec.metadata_key.empty()) {
    keys.push_back(spec.metadata_key);
    optional.push_back(spec.metadata_key);
  }
  std::vector<JsonlRecord> all =
      read_jsonl(slice.file, keys, spec.skip_bad_lines, &skipped_, optional, {spec.input_key});
  const int64_t n = static_cast<int64_t>(all.size());
  const auto [begin, end] = slice.range(n);
  if (begin >= end)
    SLIMPI_FAIL_ALL("data path '{}' selects no records (the file has {})", spec.path, n);
  const ByteTokenizer bytes;
  const Tokenizer& tok = spec.tokenizer ? *spec.tokenizer : static_cast<const Tokenizer&>(bytes);
  auto bad_line = [&](int64_t line, const std::string& why) {
    if (!spec.skip_bad_lines)
      SLIMPI_FAIL_ALL("{}:{}: key '{}': {}; data.skip_bad_lines = true skips such lines", slice.file, line,
                      spec.input_key, why);
    ++skipped_;
  };
  std::vector<ChatMessage> messages;
  for (int64_t i = begin; i < end; ++i) {
    Prompt p;
    p.line = all[i].line;
    p.text = all[i].fields[0];
    p.raw = p.text;
    if (spec.chat.enabled()) {
      const nlohmann::json value = all[i].raw_json[0] ? nlohmann::json::parse(p.text) : nlohmann::json(p.text);
      const std::string problem = parse_chat_messages(value, spec.chat.chat_template, &messages);
      if (!problem.empty()) {
        bad_line(p.line, problem);
        continue;
      }
      p.text = render_chat(messages, spec.chat, /*add_generation_prompt=*/true);
      p.chat = true;
    } else if (all[i].raw_json[0]) {
      const bool list = nlohmann::json::parse(p.text).is_array();
      bad_line(p.line, list ? "holds a list of messages; set data.chat_template (chatml, llama3 or qwen3) to render "
                              "conversations"
                            : "must be a string (or, with data.chat_template, a list of messages)");
      continue;
    }
    if (spec.max_prompt_tokens > 0) {
      const int64_t n_tokens = static_cast<int64_t>(prompt_token_ids(tok, p).size());
      if (n_tokens > spec.max_prompt_tokens) {
        if (!spec.skip_bad_lines)
          SLIMPI_FAIL_ALL("{}:{}: prompt of {} tokens; with rollout.max_new_tokens it does not fit "
                          "model.max_seq_len (at most {} prompt tokens); data.skip_bad_lines = true skips such lines",
                          slice.file, all[i].line, n_tokens, spec.max_prompt_tokens);
        ++skipped_;
        continue;
      }
    }
    p.index = static_cast<int64_t>(records_.size());
    p.label = all[i].fields[1];
    if (!spec.metadata_key.empty()) p.metadata = all[i].fields[2];
    records_.push_back(std::move(p));
  }
  if (records_.empty())
    SLIMPI_FAIL_ALL("data path '{}': every selected record was skipped as a bad line", spec.path);
  order_ = EpochOrder(static_cast<int64_t>(records_.size()), seed);
}

std::vector<Prompt> PromptSource::next(int64_t n) {
  std::vector<Prompt> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(records_[order_.order(cursor_++)]);
  return out;
}

std::vector<int64_t> prompt_token_ids(const Tokenizer& tokenizer, const Prompt& prompt) {
  return prompt.chat ? tokenizer.encode_chat(prompt.text) : tokenizer.encode_prompt(prompt.text);
}

}  // namespace slimpi
