#include "tokenizer/chat_template.h"

#include <fmt/format.h>
#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace slimpi {
namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
// Python's lstrip('\n') / rstrip('\n') / strip('\n').
std::string lstrip_newlines(const std::string& s) {
  const size_t b = s.find_first_not_of('\n');
  return b == std::string::npos ? std::string() : s.substr(b);
}
std::string rstrip_newlines(const std::string& s) {
  const size_t e = s.find_last_not_of('\n');
  return e == std::string::npos ? std::string() : s.substr(0, e + 1);
}
std::string strip_newlines(const std::string& s) { return rstrip_newlines(lstrip_newlines(s)); }

// Python's str.isspace() for one code point.
bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// Decodes the code point starting at s[i] (valid UTF-8: the JSON parser checked it);
// returns its length in bytes.
size_t decode_utf8(const std::string& s, size_t i, char32_t* c) {
  const auto b = static_cast<unsigned char>(s[i]);
  const size_t n = b < 0x80 ? 1 : b < 0xe0 ? 2 : b < 0xf0 ? 3 : 4;
  char32_t v = n == 1 ? b : n == 2 ? (b & 0x1f) : n == 3 ? (b & 0x0f) : (b & 0x07);
  for (size_t k = 1; k < n && i + k < s.size(); ++k) v = (v << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  *c = v;
  return n;
}

constexpr const char* kImStart = "<|im_start|>";
constexpr const char* kImEnd = "<|im_end|>\n";

// A run of tool messages is one user turn of <tool_response> blocks (Qwen2.5, Qwen3).
void render_tool_message(const std::vector<ChatMessage>& m, size_t i, std::string* out) {
  if (i == 0 || m[i - 1].role != "tool") *out += std::string(kImStart) + "user";
  *out += "\n<tool_response>\n" + m[i].content + "\n</tool_response>";
  if (i + 1 == m.size() || m[i + 1].role != "tool") *out += kImEnd;
}

std::string render_chatml(const std::vector<ChatMessage>& m, bool gen) {
  std::string out;
  for (size_t i = 0; i < m.size(); ++i) {
    if (m[i].role == "tool") render_tool_message(m, i, &out);
    else out += kImStart + m[i].role + "\n" + m[i].content + kImEnd;
  }
  if (gen) out += std::string(kImStart) + "assistant\n";
  return out;
}

std::string render_llama3(const std::vector<ChatMessage>& m, const std::string& bos, bool gen) {
  std::string out = bos;
  for (const ChatMessage& msg : m)
    // A tool result (an environment's observation) is Llama 3.1's ipython turn.
    out += "<|start_header_id|>" + (msg.role == "tool" ? std::string("ipython") : msg.role) +
           "<|end_header_id|>\n\n" + strip_unicode_whitespace(msg.content) +
           "<|eot_id|>";
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string render_qwen3(const std::vector<ChatMessage>& m, bool enable_thinking, bool gen) {
  const size_t n = m.size();
  std::string out;
  if (m[0].role == "system") out += std::string(kImStart) + "system\n" + m[0].content + kImEnd;
  // The last user message that is not a tool response: assistant turns after it keep
  // their reasoning.
  size_t last_query = n - 1;
  for (size_t k = n; k-- > 0;) {
    const std::string& c = m[k].content;
    if (m[k].role == "user" && !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& msg = m[i];
    if (msg.role == "user" || (msg.role == "system" && i > 0)) {
      out += kImStart + msg.role + "\n" + msg.content + kImEnd;
    } else if (msg.role == "assistant") {
      std::string content = msg.content, reasoning;
      if (msg.has_reasoning) {
        reasoning = msg.reasoning;
      } else if (content.find("</think>") != std::string::npos) {
        // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
        std::string before = rstrip_newlines(content.substr(0, content.find("</think>")));
        const size_t open = before.rfind("<think>");
        if (open != std::string::npos) before = before.substr(open + 7);
        reasoning = lstrip_newlines(before);
        content = lstrip_newlines(content.substr(content.rfind("</think>") + 8));
      }
      if (i > last_query && (i + 1 == n || !reasoning.empty()))
        out += std::string(kImStart) + "assistant\n<think>\n" + strip_newlines(reasoning) + "\n</think>\n\n" +
               lstrip_newlines(content);
      else
        out += std::string(kImStart) + "assistant\n" + content;
      out += kImEnd;
    } else if (msg.role == "tool") {
      render_tool_message(m, i, &out);
    }
  }
  if (gen) {
    out += std::string(kImStart) + "assistant\n";
    if (!enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

}  // namespace

std::string strip_unicode_whitespace(const std::string& s) {
  size_t begin = 0, end = 0;  // [begin, end): the first non-space code point to past the last
  bool seen = false;
  for (size_t i = 0; i < s.size();) {
    char32_t c;
    const size_t len = decode_utf8(s, i, &c);
    if (!is_python_space(c)) {
      if (!seen) begin = i;
      seen = true;
      end = i + len;
    }
    i += len;
  }
  return seen ? s.substr(begin, end - begin) : std::string();
}

const Registry<ChatTemplateSpec>& chat_templates() {
  static const Registry<ChatTemplateSpec> r = [] {
    using Messages = std::vector<ChatMessage>;
    Registry<ChatTemplateSpec> reg("data.chat_template");
    reg.add("none", {ChatTemplate::None, "none", "", nullptr});
    reg.add("chatml", {ChatTemplate::ChatML, "chatml", "<|im_end|>",
                       [](const Messages& m, const ChatFormat&, bool gen) { return render_chatml(m, gen); }});
    reg.add("llama3", {ChatTemplate::Llama3, "llama3", "<|eot_id|>", [](const Messages& m, const ChatFormat& f, bool gen) {
                         return render_llama3(m, f.bos_token, gen);
                       }});
    reg.add("qwen3", {ChatTemplate::Qwen3, "qwen3", "<|im_end|>", [](const Messages& m, const ChatFormat& f, bool gen) {
                        return render_qwen3(m, f.enable_thinking, gen);
                      }});
    return reg;
  }();
  return r;
}

namespace {

const ChatTemplateSpec& spec_of(ChatTemplate t) {
  for (const std::string& name : chat_templates().names())
    if (chat_templates().get(name).id == t) return chat_templates().get(name);
  SLIMPI_FAIL("chat template {} has no registry entry", int(t));
}

}  // namespace

std::string ChatFormat::end_of_turn() const { return spec_of(chat_template).end_of_turn; }

ChatTemplate parse_chat_template(const std::string& name) { return chat_templates().get(name).id; }

const char* chat_template_name(ChatTemplate t) { return spec_of(t).name; }

std::optional<ChatTemplate> recognise_chat_template(const std::string& jinja) {
  const auto has = [&](const char* marker) { return jinja.find(marker) != std::string::npos; };
  if (has("<|im_start|>")) return has("<think>") ? ChatTemplate::Qwen3 : ChatTemplate::ChatML;
  if (has("<|start_header_id|>") && has("<|eot_id|>")) return ChatTemplate::Llama3;
  return std::nullopt;
}

namespace {

// data.chat_template, with "auto" resolved against the model's shipped template.
ChatTemplate chosen_template(const Deck& deck, const Tokenizer& tokenizer) {
  const std::string& name = deck.get_string("data.chat_template");
  if (name != "auto") return parse_chat_template(name);
  const Tokenizer::ShippedTemplate shipped = tokenizer.shipped_chat_template();
  if (shipped.text.empty()) return ChatTemplate::None;
  if (auto t = recognise_chat_template(shipped.text)) return *t;
  SLIMPI_FAIL_ALL("data.chat_template = \"auto\" ({}): the chat template in {} is not one slimpi implements "
                  "(chatml, llama3, qwen3); name one of them if it renders the same, or \"none\"",
                  deck.source("data.chat_template"), shipped.source);
}

}  // namespace

std::string describe_chat_template_choice(const Deck& deck, const Tokenizer& tokenizer) {
  const Tokenizer::ShippedTemplate shipped = tokenizer.shipped_chat_template();
  const std::string& name = deck.get_string("data.chat_template");
  const std::string where = deck.source("data.chat_template");
  if (shipped.text.empty())
    return name == "auto" ? fmt::format("data.chat_template = \"auto\" ({}): {} ships no chat template; prompts are "
                                        "used as they are",
                                        where, tokenizer.describe())
                          : std::string();
  const std::optional<ChatTemplate> shipped_as = recognise_chat_template(shipped.text);
  const std::string what = shipped_as ? fmt::format("a chat template slimpi renders as \"{}\"",
                                                    chat_template_name(*shipped_as))
                                      : std::string("a chat template slimpi does not implement");
  if (name == "auto")  // (an unrecognised one is refused by ChatFormat::from_deck)
    return shipped_as ? fmt::format("data.chat_template = \"auto\" ({}): {} holds {}: using it", where,
                                    shipped.source, what)
                      : std::string();
  const ChatTemplate chosen = parse_chat_template(name);
  if (shipped_as && *shipped_as == chosen) return std::string();
  if (chosen == ChatTemplate::None)
    return fmt::format("the model ships {} ({}), but data.chat_template = none ({}): prompts are used as they are, "
                       "not in its chat format{}",
                       what, shipped.source, where,
                       shipped_as ? fmt::format(" (set data.chat_template = \"{}\" or \"auto\")",
                                                chat_template_name(*shipped_as))
                                  : std::string());
  return fmt::format("the model ships {} ({}), but data.chat_template = \"{}\" ({}) renders another", what,
                     shipped.source, name, where);
}

ChatFormat ChatFormat::from_deck(const Deck& deck, const Tokenizer& tokenizer) {
  ChatFormat f;
  f.chat_template = chosen_template(deck, tokenizer);
  f.system_prompt = deck.get_string("data.system_prompt");
  f.enable_thinking = deck.get_bool("data.enable_thinking");
  if (!f.enabled() && !f.system_prompt.empty())
    SLIMPI_FAIL_ALL("data.system_prompt ({}) is put into conversations by a chat template, but data.chat_template "
                    "renders none ({}); choose chatml, llama3 or qwen3",
                    deck.source("data.system_prompt"), deck.source("data.chat_template"));
  if (!f.enable_thinking && f.chat_template != ChatTemplate::Qwen3)
    SLIMPI_FAIL_ALL("data.enable_thinking = false ({}) is a qwen3 template switch; data.chat_template = {} ({}) "
                    "has no thinking block",
                    deck.source("data.enable_thinking"), chat_template_name(f.chat_template),
                    deck.source("data.chat_template"));
  if (f.chat_template == ChatTemplate::Llama3) {
    f.bos_token = tokenizer.bos_token();
    if (f.bos_token.empty())
      SLIMPI_FAIL_ALL("data.chat_template = llama3 ({}) starts every conversation with the tokenizer's bos_token, "
                      "but {} has none (tokenizer_config.json: bos_token)",
                      deck.source("data.chat_template"), tokenizer.describe());
  }
  return f;
}

std::string parse_chat_messages(const nlohmann::json& value, ChatTemplate t, std::vector<ChatMessage>* out) {
  out->clear();
  if (value.is_string()) {
    out->push_back({"user", value.get<std::string>(), false, ""});
    return "";
  }
  if (!value.is_array()) return fmt::format("a prompt is a string or a list of messages, got {}", value.type_name());
  if (value.empty()) return "the message list is empty";
  for (size_t i = 0; i < value.size(); ++i) {
    const nlohmann::json& m = value[i];
    if (!m.is_object()) return fmt::format("message {} is {}, not an object with role and content", i, m.type_name());
    ChatMessage msg;
    for (const auto& [key, v] : m.items()) {
      if (key == "role" || key == "content") {
        if (!v.is_string())
          return fmt::format("message {}: '{}' must be a string, got {}{}", i, key, v.type_name(),
                             key == "content" ? " (multimodal content is not supported)" : "");
        (key == "role" ? msg.role : msg.content) = v.get<std::string>();
      } else if (key == "reasoning_content" && t == ChatTemplate::Qwen3) {
        if (!v.is_null() && !v.is_string())
          return fmt::format("message {}: 'reasoning_content' must be a string, got {}", i, v.type_name());
        msg.has_reasoning = v.is_string();
        if (msg.has_reasoning) msg.reasoning = v.get<std::string>();
      } else {
        return fmt::format("message {}: key '{}' is not supported by the {} template (role, content{})", i, key,
                           chat_template_name(t), t == ChatTemplate::Qwen3 ? ", reasoning_content" : "");
      }
    }
    if (!m.contains("role") || !m.contains("content"))
      return fmt::format("message {} needs both 'role' and 'content'", i);
    const bool known = msg.role == "system" || msg.role == "user" || msg.role == "assistant" ||
                       (msg.role == "tool" && t != ChatTemplate::Llama3);
    if (!known)
      return fmt::format("message {}: role '{}' is not one the {} template renders (system, user, assistant{})", i,
                         msg.role, chat_template_name(t), t == ChatTemplate::Llama3 ? "" : ", tool");
    if (msg.has_reasoning && msg.role != "assistant")
      return fmt::format("message {}: reasoning_content belongs to assistant messages, not {}", i, msg.role);
    out->push_back(std::move(msg));
  }
  return "";
}

std::string render_chat(std::vector<ChatMessage> messages, const ChatFormat& f, bool add_generation_prompt) {
  SLIMPI_CHECK(f.enabled(), "render_chat: no chat template");
  SLIMPI_CHECK(!messages.empty(), "render_chat: no messages");
  if (!f.system_prompt.empty() && messages.front().role != "system")
    messages.insert(messages.begin(), ChatMessage{"system", f.system_prompt, false, ""});
  return spec_of(f.chat_template).render(messages, f, add_generation_prompt);
}

}  // namespace slimpi
