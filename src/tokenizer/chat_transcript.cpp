#include "tokenizer/chat_transcript.h"

#include <slimpi/error.h>
#include <fmt/format.h>

#include <nlohmann/json.hpp>

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

// Model text is raw bytes (a turn may end inside a UTF-8 sequence): saved as a JSON
// string of one code point per byte (U+0000..U+00FF), exact both ways.
std::string bytes_as_code_points(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) {
    if (b < 0x80) {
      out += char(b);
    } else {
      out += char(0xC0 | (b >> 6));
      out += char(0x80 | (b & 0x3F));
    }
  }
  return out;
}

std::string code_points_as_bytes(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      out += char(c);
    } else {
      SLIMPI_CHECK((c == 0xC2 || c == 0xC3) && i + 1 < text.size(), "a saved chat transcript holds a character past U+00FF");
      out += char(((c & 0x03) << 6) | (static_cast<unsigned char>(text[++i]) & 0x3F));
    }
  }
  return out;
}

}  // namespace

ChatTranscript::ChatTranscript(const ChatFormat& format) : format_(format) {
  if (!format_.enabled()) return;
  conversation_.push_back({"user", "", false, ""});  // stands for the prompt, rendered with the same rules
  opened_ = render_chat(conversation_, format_, /*add_generation_prompt=*/true);
}

void ChatTranscript::add_model_turn(const std::string& text, const std::string& sampled_end) {
  if (!format_.enabled()) return;
  // Without thinking (qwen3, qwen3_5, glm45, glm47) the generation prompt opened the turn with an empty
  // <think> block: the turn's message carries it, as the model's own text would.
  const char* thinking_off = chat_template_spec(format_.chat_template).thinking_off;
  const bool empty_think = thinking_off != nullptr && !format_.enable_thinking;
  conversation_.push_back({"assistant", empty_think ? thinking_off + text : text, false, ""});
  sampled_end_ = sampled_end;
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
  // The end of the model's turn as rendered: the first of the template's turn ends (GLM
  // ends a turn with the opener of what follows: <|user|>, or <|observation|> before tools).
  size_t at = std::string::npos;
  std::string end;
  for (const std::string& e : format_.turn_ends()) {
    const size_t k = full.find(e, opened_.size());
    if (k < at) at = k, end = e;
  }
  if (at == std::string::npos) {
    *error = fmt::format("the {} chat template rendered the model's turn without its end-of-turn marker {}",
                         chat_template_name(format_.chat_template), format_.end_of_turn());
    return "";
  }
  opened_ = full;
  // A sampled turn end is in the stream already; another marker is appended (a GLM turn
  // that sampled <|user|> before tool results keeps it, then <|observation|>).
  const bool in_stream = sampled_end_ == end;
  return (in_stream ? std::string() : end) + full.substr(at + end.size());
}

std::string ChatTranscript::save() const {
  nlohmann::json messages = nlohmann::json::array();
  for (const ChatMessage& m : conversation_) {
    nlohmann::json j = {{"role", m.role}, {"content", bytes_as_code_points(m.content)}};
    if (m.has_reasoning) j["reasoning"] = bytes_as_code_points(m.reasoning);
    messages.push_back(std::move(j));
  }
  return nlohmann::json{{"template", chat_template_name(format_.chat_template)},
                        {"enable_thinking", format_.enable_thinking},
                        {"conversation", messages},
                        {"opened", bytes_as_code_points(opened_)},
                        {"sampled_end", bytes_as_code_points(sampled_end_)}}
      .dump();
}

ChatTranscript ChatTranscript::load(const ChatFormat& format, const std::string& saved) {
  ChatTranscript t(format);
  try {
    const nlohmann::json j = nlohmann::json::parse(saved);
    const std::string tpl = j.at("template").get<std::string>();
    const bool thinking = j.at("enable_thinking").get<bool>();
    SLIMPI_CHECK(tpl == chat_template_name(format.chat_template) && thinking == format.enable_thinking,
                 "the conversation was rendered with data.chat_template = \"{}\" (enable_thinking {}); this job's is "
                 "\"{}\" ({}): it cannot be continued under another template", tpl, thinking,
                 chat_template_name(format.chat_template), format.enable_thinking);
    t.conversation_.clear();
    for (const nlohmann::json& m : j.at("conversation")) {
      ChatMessage msg{m.at("role").get<std::string>(), code_points_as_bytes(m.at("content").get<std::string>()),
                      m.contains("reasoning"), ""};
      if (msg.has_reasoning) msg.reasoning = code_points_as_bytes(m.at("reasoning").get<std::string>());
      t.conversation_.push_back(std::move(msg));
    }
    t.opened_ = code_points_as_bytes(j.at("opened").get<std::string>());
    const nlohmann::json& end = j.at("sampled_end");  // (a bool before GLM's two turn ends: the end of turn)
    t.sampled_end_ = end.is_boolean() ? (end.get<bool>() ? format.end_of_turn() : std::string())
                                      : code_points_as_bytes(end.get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    SLIMPI_FAIL("a saved chat transcript is not one ChatTranscript::save() wrote: {}", e.what());
  }
  return t;
}

}  // namespace slimpi
