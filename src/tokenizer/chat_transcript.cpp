#include "tokenizer/chat_transcript.h"

#include <fmt/format.h>

namespace slimpi {
namespace {

// The first byte where a and b differ, with a little context around it.
std::string first_difference(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  const size_t from = i > 40 ? i - 40 : 0;
  return fmt::format("at byte {}: the stream holds \"{}\", the template now renders \"{}\"", i,
                     a.substr(from, i - from + 40), b.substr(from, i - from + 40));
}

}  // namespace

ChatTranscript::ChatTranscript(const ChatFormat& format) : format_(format) {
  if (!format_.enabled()) return;
  conversation_.push_back({"user", "", false, ""});  // stands for the prompt, rendered with the same rules
  stream_ = render_chat(conversation_, format_, /*add_generation_prompt=*/true);
}

void ChatTranscript::add_model_turn(const std::string& text, bool ended_on_stop_token) {
  if (!format_.enabled()) return;
  // qwen3 without thinking opened the turn with an empty <think> block (its generation
  // prompt): the turn's message carries it, as the model's own text would.
  const bool empty_think = format_.chat_template == ChatTemplate::Qwen3 && !format_.enable_thinking;
  const std::string content = empty_think ? "<think>\n\n</think>\n\n" + text : text;
  conversation_.push_back({"assistant", content, false, ""});
  stream_ += text;
  if (ended_on_stop_token) stream_ += format_.end_of_turn();
}

std::string ChatTranscript::add_observation(const std::vector<ChatMessage>& messages, std::string* error) {
  error->clear();
  if (!format_.enabled()) {
    std::string out;
    for (const ChatMessage& m : messages)
      out += m.role == "tool" ? "<tool_response>\n" + m.content + "\n</tool_response>\n" : m.content + "\n";
    return out;
  }
  for (const ChatMessage& m : messages) conversation_.push_back(m);
  const std::string full = render_chat(conversation_, format_, /*add_generation_prompt=*/true);
  if (full.compare(0, stream_.size(), stream_) != 0 || full.size() < stream_.size()) {
    *error = fmt::format("the {} chat template rewrites the conversation's history once the observation is added "
                         "({}); the token stream cannot be continued without re-tokenising it",
                         chat_template_name(format_.chat_template), first_difference(stream_, full));
    return "";
  }
  std::string delta = full.substr(stream_.size());
  stream_ = full;
  return delta;
}

}  // namespace slimpi
