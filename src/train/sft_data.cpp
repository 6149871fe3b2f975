#include "train/sft_data.h"

#include <slimpi/error.h>

#include <nlohmann/json.hpp>

#include "data/jsonl_file.h"
#include "data/prompt_source.h"
#include "tokenizer/byte_tokenizer.h"

namespace slimpi {

namespace {

// The (prompt, response) texts of a conversation line; throws (collectively) naming file:line.
std::pair<std::string, std::string> split_conversation(const JsonlRecord& r, bool has_response, const ChatFormat& chat,
                                                       const std::string& where) {
  std::vector<ChatMessage> messages;
  const nlohmann::json value = r.raw_json[0] ? nlohmann::json::parse(r.fields[0]) : nlohmann::json(r.fields[0]);
  const std::string problem = parse_chat_messages(value, chat.chat_template, &messages);
  if (!problem.empty()) SLIMPI_FAIL_ALL("{}: {}", where, problem);
  if (has_response) {
    messages.push_back({"assistant", r.fields[1], false, ""});
  } else if (messages.back().role != "assistant") {
    SLIMPI_FAIL_ALL("{}: an SFT conversation without a response key must end with the assistant's reply (its last "
                    "message is '{}')",
                    where, messages.back().role);
  }
  const std::string whole = render_chat(messages, chat, /*add_generation_prompt=*/false);
  messages.pop_back();
  if (messages.empty())
    SLIMPI_FAIL_ALL("{}: the conversation is only the assistant's reply; it needs a message before it", where);
  const std::string prompt = render_chat(messages, chat, /*add_generation_prompt=*/true);
  if (whole.compare(0, prompt.size(), prompt) != 0)
    SLIMPI_FAIL_ALL("{}: the {} template renders this conversation's context differently with and without its reply, "
                    "so the reply cannot be split off as the trained response",
                    where, chat_template_name(chat.chat_template));
  // The trained reply runs up to and with the end-of-turn marker (what comes after it
  // opens the next turn and is never generated).
  std::string reply = whole.substr(prompt.size());
  // GLM writes no marker after a reply (the next message's opener ends it): the reply
  // is trained to end with the end-of-turn opener <|user|>, as a generation stops there.
  if (!chat_template_spec(chat.chat_template).reply_closes_itself) reply += chat.end_of_turn();
  const size_t end = reply.rfind(chat.end_of_turn());
  if (end == std::string::npos)
    SLIMPI_FAIL_ALL("{}: the {} template's reply has no end-of-turn marker {}", where,
                    chat_template_name(chat.chat_template), chat.end_of_turn());
  reply.resize(end + chat.end_of_turn().size());
  return {prompt, reply};
}

}  // namespace

SftData::SftData(const std::string& path, const std::string& input_key, const std::string& response_key,
                 int64_t max_seq_len, uint64_t seed, const Tokenizer& tok, const ChatFormat& chat)
    : order_(0, seed) {
  std::vector<std::string> optional, json_keys;
  if (chat.enabled()) {
    optional.push_back(response_key);  // a conversation may carry its reply as the last message
    json_keys.push_back(input_key);
  }
  // data.path may select records as file.jsonl@[a:b], as for RL prompts (data/prompt_source.h).
  const PathSlice slice = parse_path_slice(path);
  const std::vector<JsonlRecord> all = read_jsonl(slice.file, {input_key, response_key}, false, nullptr, optional,
                                                  json_keys);
  const auto [first, last] = slice.range(int64_t(all.size()));
  if (first >= last) SLIMPI_FAIL_ALL("data path '{}' selects no records (the file has {})", path, all.size());
  for (int64_t i = first; i < last; ++i) {
    const JsonlRecord& r = all[size_t(i)];
    const std::string where = fmt::format("{}:{}", slice.file, r.line);
    Sample s;
    std::vector<int64_t> response;
    if (chat.enabled()) {
      if (r.raw_json[1]) SLIMPI_FAIL_ALL("{}: key '{}' must be a string", where, response_key);
      const auto [prompt, reply] = split_conversation(r, r.present[1], chat, where);
      s.tokens = tok.encode_chat(prompt);
      response = tok.encode_text(reply);
      // Generation stops at the marker when it is one token (RolloutConfig makes it a stop
      // id); where the vocabulary spells it in pieces (the byte tokenizer) the reply ends
      // with the vocabulary's EOS, as plain SFT does, so that a policy learns to stop.
      if (tok.encode_text(chat.end_of_turn()).size() != 1) response.push_back(tok.stop_ids().front());
    } else {
      s.tokens = tok.encode_prompt(r.fields[0]);
      response = tok.encode_response(r.fields[1]);
    }
    s.prompt_length = static_cast<int64_t>(s.tokens.size());
    s.tokens.insert(s.tokens.end(), response.begin(), response.end());
    if (int64_t(s.tokens.size()) > max_seq_len)
      SLIMPI_FAIL_ALL("{}: prompt + response is {} tokens, longer than model.max_seq_len = {}", where,
                      s.tokens.size(), max_seq_len);
    samples_.push_back(std::move(s));
  }
  order_ = EpochOrder(static_cast<int64_t>(samples_.size()), seed);
}

std::vector<Sample> SftData::batch(int64_t step, int64_t global_batch_size, int dp_rank, int dp_size) const {
  const int64_t first = step * global_batch_size;
  const int64_t lo = global_batch_size * dp_rank / dp_size, hi = global_batch_size * (dp_rank + 1) / dp_size;
  std::vector<Sample> out;
  for (int64_t k = lo; k < hi; ++k) out.push_back(samples_[order(first + k)]);
  return out;
}

}  // namespace slimpi
