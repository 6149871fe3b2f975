// The built-in chat templates' render functions (registered in chat_template.cpp's
// chat_templates()); each is checked against transformers' rendering of the model's own
// Jinja template on tests/fixtures/chat. Pure functions.
#include "tokenizer/chat_renderers.h"

#include <slimpi/error.h>

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

// An assistant message's reasoning and answer, as Qwen3's and GLM-4.5's templates take
// them: reasoning_content when given; else, when the content holds </think>,
//   reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
//   content   = content.split('</think>')[-1].lstrip('\n')
void split_reasoning(const ChatMessage& msg, std::string* reasoning, std::string* content) {
  *content = msg.content;
  reasoning->clear();
  if (msg.has_reasoning) {
    *reasoning = msg.reasoning;
  } else if (content->find("</think>") != std::string::npos) {
    std::string before = rstrip_newlines(content->substr(0, content->find("</think>")));
    const size_t open = before.rfind("<think>");
    if (open != std::string::npos) before = before.substr(open + 7);
    *reasoning = lstrip_newlines(before);
    *content = lstrip_newlines(content->substr(content->rfind("</think>") + 8));
  }
}

constexpr const char* kImStart = "<|im_start|>";
constexpr const char* kImEnd = "<|im_end|>\n";

// A run of tool messages is one user turn of <tool_response> blocks (Qwen2.5, Qwen3).
void render_tool_message(const std::vector<ChatMessage>& m, size_t i, std::string* out) {
  if (i == 0 || m[i - 1].role != "tool") *out += std::string(kImStart) + "user";
  *out += "\n<tool_response>\n" + m[i].content + "\n</tool_response>";
  if (i + 1 == m.size() || m[i + 1].role != "tool") *out += kImEnd;
}

// The last user message that is not a tool response (its content, as the template tests
// it, stripped first by qwen3_5): assistant turns after it keep their reasoning. npos: none.
size_t last_user_query(const std::vector<ChatMessage>& m, bool strip) {
  for (size_t k = m.size(); k-- > 0;) {
    const std::string c = strip ? strip_unicode_whitespace(m[k].content) : m[k].content;
    if (m[k].role == "user" && !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) return k;
  }
  return std::string::npos;
}

}  // namespace

bool has_user_query(const std::vector<ChatMessage>& m) { return last_user_query(m, true) != std::string::npos; }

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
  // Assistant turns after the last user query keep their reasoning (none: every turn).
  const size_t found = last_user_query(m, false), last_query = found == std::string::npos ? n - 1 : found;
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& msg = m[i];
    if (msg.role == "user" || (msg.role == "system" && i > 0)) {
      out += kImStart + msg.role + "\n" + msg.content + kImEnd;
    } else if (msg.role == "assistant") {
      std::string content, reasoning;
      split_reasoning(msg, &reasoning, &content);
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



// Qwen3.5 (its Jinja, the 4B-and-larger models' one): every content stripped first, then
//   system     "<|im_start|>system\n{content}<|im_end|>\n", first only
//   user       "<|im_start|>user\n{content}<|im_end|>\n"
//   assistant  "<|im_start|>assistant\n" + ("<think>\n{reasoning.strip()}\n</think>\n\n" after the
//              last user query, even when empty) + content (its <think> block split off as
//              qwen3 splits it) + "<|im_end|>\n"
//   tool       qwen3's <tool_response> blocks, the user turn opened unless the run starts the
//              conversation
// and the generation prompt "<|im_start|>assistant\n<think>\n" ("<think>\n\n</think>\n\n" without
// thinking). parse_chat_messages refuses what the template raises on.
std::string render_qwen3_5(const std::vector<ChatMessage>& m, bool enable_thinking, bool gen) {
  const size_t n = m.size(), last_query = last_user_query(m, true);
  SLIMPI_CHECK(last_query != std::string::npos, "qwen3_5 template: no user query in the conversation");
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    ChatMessage msg = m[i];
    msg.content = strip_unicode_whitespace(msg.content);
    if (msg.role == "system") {
      SLIMPI_CHECK(i == 0, "qwen3_5 template: a system message after the first (message {})", i);
      out += std::string(kImStart) + "system\n" + msg.content + kImEnd;
    } else if (msg.role == "user") {
      out += std::string(kImStart) + "user\n" + msg.content + kImEnd;
    } else if (msg.role == "assistant") {
      std::string content, reasoning;
      split_reasoning(msg, &reasoning, &content);
      out += std::string(kImStart) + "assistant\n";
      if (i > last_query) out += "<think>\n" + strip_unicode_whitespace(reasoning) + "\n</think>\n\n";
      out += content + kImEnd;
    } else if (msg.role == "tool") {
      if (i > 0 && m[i - 1].role != "tool") out += std::string(kImStart) + "user";
      out += "\n<tool_response>\n" + msg.content + "\n</tool_response>";
      if (i + 1 == n || m[i + 1].role != "tool") out += kImEnd;
    }
  }
  if (gen) out += std::string(kImStart) + "assistant\n" + (enable_thinking ? "<think>\n" : "<think>\n\n</think>\n\n");
  return out;
}

namespace {

// What GLM-4.5's and GLM-4.7's templates write differently; the rest is one template.
struct GlmStyle {
  const char* nl;            // between an opener or a tag and its text: "\n" (4.5), "" (4.7)
  const char* no_reasoning;  // an assistant turn without kept reasoning, and the generation
                             // prompt's tail without thinking: "\n<think></think>", "</think>"
  const char* gen_thinking;  // the generation prompt's tail with thinking: "", "<think>"
  bool nothink_suffix;       // without thinking, user messages end with "/nothink" (4.5)
};

// "[gMASK]<sop>", then per message (nl between each opener and its text)
//   system     "<|system|>{content}";  user "<|user|>{content}" (+ "/nothink", 4.5 without
//              thinking, when it does not end so)
//   assistant  "<|assistant|>" + ("<think>{reasoning.strip()}</think>" after the last user
//              message when it has reasoning, else no_reasoning) + content.strip() when not blank
//   tool       "<|observation|>" before a run of tool messages, then
//              "<tool_response>{content}</tool_response>" each
// and the generation prompt "<|assistant|>" + gen_thinking (no_reasoning without thinking).
std::string render_glm(const std::vector<ChatMessage>& m, bool enable_thinking, bool gen, const GlmStyle& g) {
  const std::string nl = g.nl;
  size_t last_user = std::string::npos;  // ns.last_user_index (-1 when there is none)
  for (size_t k = 0; k < m.size(); ++k)
    if (m[k].role == "user") last_user = k;
  std::string out = "[gMASK]<sop>";
  for (size_t i = 0; i < m.size(); ++i) {
    const ChatMessage& msg = m[i];
    if (msg.role == "user") {
      out += "<|user|>" + nl + msg.content;
      if (g.nothink_suffix && !enable_thinking && !ends_with(msg.content, "/nothink")) out += "/nothink";
    } else if (msg.role == "assistant") {
      std::string content, reasoning;
      split_reasoning(msg, &reasoning, &content);
      const bool after_last_user = last_user == std::string::npos || i > last_user;
      out += "<|assistant|>";
      out += after_last_user && !reasoning.empty() ? nl + "<think>" + strip_unicode_whitespace(reasoning) + "</think>"
                                                   : std::string(g.no_reasoning);
      const std::string answer = strip_unicode_whitespace(content);
      if (!answer.empty()) out += nl + answer;
    } else if (msg.role == "tool") {
      if (i == 0 || m[i - 1].role != "tool") out += "<|observation|>";
      out += nl + "<tool_response>" + nl + msg.content + nl + "</tool_response>";
    } else if (msg.role == "system") {
      out += "<|system|>" + nl + msg.content;
    }
  }
  if (gen) out += std::string("<|assistant|>") + (enable_thinking ? g.gen_thinking : g.no_reasoning);
  return out;
}

}  // namespace

// GLM-4.5's template (zai-org/GLM-4.5, also GLM-4.5-Air): newlines between openers and
// text, "\n<think></think>" for a turn without kept reasoning, no closing marker (the next
// message's opener ends a turn), "/nothink" without thinking.
std::string render_glm45(const std::vector<ChatMessage>& m, bool enable_thinking, bool gen) {
  return render_glm(m, enable_thinking, gen, {"\n", "\n<think></think>", "", true});
}

// GLM-4.7's template (GLM-4.7 and GLM-4.7-Flash, glm4_moe_lite): GLM-4.5's openers without
// their newlines, "</think>" for a turn without kept reasoning, the generation opened with
// "<think>" ("</think>" without thinking). clear_thinking is left undefined, as
// transformers' default.
std::string render_glm47(const std::vector<ChatMessage>& m, bool enable_thinking, bool gen) {
  return render_glm(m, enable_thinking, gen, {"", "</think>", "<think>", false});
}

namespace {

// DeepSeek's templates: bos_token, the system prompt, then per message
//   user       "<｜User｜>{content}"
//   assistant  "<｜Assistant｜>{content}<｜end▁of▁sentence｜>"; right after tool results
//              "<｜tool▁outputs▁end｜>{content}<｜end▁of▁sentence｜>"
//   tool       "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{content}<｜tool▁output▁end｜>" for
//              the conversation's first tool message, "\n<｜tool▁output▁begin｜>{content}
//              <｜tool▁output▁end｜>" for every later one (the templates never reset it)
// and, when the last message is a tool result, "<｜tool▁outputs▁end｜>" and no generation
// prompt; otherwise the generation prompt "<｜Assistant｜>".
// DeepSeek-R1 (deepseek-ai/DeepSeek-R1): the last system message is the system prompt; a
// turn not after tool results keeps only its content after its last </think>; the
// generation prompt is "<｜Assistant｜><think>\n" (so a finished turn never renders as it
// was opened: a conversation cannot be continued token for token).
// DeepSeek-V3 (deepseek-ai/DeepSeek-V3-0324): every system message, joined by a blank
// line, is the system prompt; turns as written; the generation prompt "<｜Assistant｜>".
std::string render_deepseek(const std::vector<ChatMessage>& m, const std::string& bos, bool gen, bool r1) {
  std::string system;
  bool first_system = true;
  for (const ChatMessage& msg : m) {
    if (msg.role != "system") continue;
    system = r1 || first_system ? msg.content : system + "\n\n" + msg.content;
    first_system = false;
  }
  std::string out = bos + system;
  bool after_tool = false, first_output = true;
  for (const ChatMessage& msg : m) {
    if (msg.role == "user") {
      after_tool = false;
      out += "<｜User｜>" + msg.content;
    } else if (msg.role == "assistant") {
      if (after_tool) {
        out += "<｜tool▁outputs▁end｜>" + msg.content + "<｜end▁of▁sentence｜>";
        after_tool = false;
      } else {
        const size_t think_end = r1 ? msg.content.rfind("</think>") : std::string::npos;
        out += "<｜Assistant｜>" +
               (think_end == std::string::npos ? msg.content : msg.content.substr(think_end + 8)) +
               "<｜end▁of▁sentence｜>";
      }
    } else if (msg.role == "tool") {
      after_tool = true;
      out += first_output ? "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>" : "\n<｜tool▁output▁begin｜>";
      out += msg.content + "<｜tool▁output▁end｜>";
      first_output = false;
    }
  }
  if (after_tool) out += "<｜tool▁outputs▁end｜>";
  else if (gen) out += r1 ? "<｜Assistant｜><think>\n" : "<｜Assistant｜>";
  return out;
}

}  // namespace

std::string render_deepseek_r1(const std::vector<ChatMessage>& m, const std::string& bos, bool gen) {
  return render_deepseek(m, bos, gen, /*r1=*/true);
}

std::string render_deepseek_v3(const std::vector<ChatMessage>& m, const std::string& bos, bool gen) {
  return render_deepseek(m, bos, gen, /*r1=*/false);
}

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


}  // namespace slimpi
