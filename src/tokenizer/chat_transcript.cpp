#include "tokenizer/chat_transcript.h"

#include <fmt/format.h>

namespace slimpi {
namespace {

// The first byte where a and b differ, with a little context around it.
std::string first_difference(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  const size_t from = i > 40 ? i - 40 : 0;
  return fmt::format("at byte {}: it rendered \"{}\" before, \"{}\" now", i, a.substr(from, i - from + 40),
                     b.substr(from, i - from + 40));
}

}  // namespace

ChatTranscript::ChatTranscript(const ChatFormat& format) : format_(format) {
  if (!format_.enabled()) return;
  conversation_.push_back({"user", "", false, ""});  // stands for the prompt, rendered with the same rules
  opened_ = render_chat(conversation_, format_, /*add_generation_prompt=*/true);
}

void ChatTranscript::add_model_turn(const std::string& text, bool ended_on_end_of_turn) {
  if (!format_.enabled()) return;
  // qwen3 without thinking opened the turn with an empty <think> block (its generation
  // prompt): the turn's message carries it, as the model's own text would.
  const bool empty_think = format_.chat_template == ChatTemplate::Qwen3 && !format_.enable_thinking;
  conversation_.push_back({"assistant", empty_think ? "<think>\n\n</think>\n\n" + text : text, false, ""});
  sampled_end_ = ended_on_end_of_turn;
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
  if (full.size() < opened_.size() || full.compare(0, opened_.size(), opened_) != 0) {
    *error = fmt::format("the {} chat template rewrites the conversation's history once the model's turn and the "
                         "observation are added ({}); the token stream cannot be continued without re-tokenising it",
                         chat_template_name(format_.chat_template), first_difference(opened_, full));
    return "";
  }
  const std::string end = format_.end_of_turn();
  const size_t at = full.find(end, opened_.size());  // the end of the model's turn as rendered
  if (at == std::string::npos) {
    *error = fmt::format("the {} chat template rendered the model's turn without its end-of-turn marker {}",
                         chat_template_name(format_.chat_template), end);
    return "";
  }
  opened_ = full;
  return (sampled_end_ ? std::string() : end) + full.substr(at + end.size());
}

}  // namespace slimpi
