#include "tokenizer/chat_template.h"

#include <fmt/format.h>
#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_renderers.h"
#include "tokenizer/tokenizer.h"

namespace slimpi {

const Registry<ChatTemplateSpec>& chat_templates() {
  static const Registry<ChatTemplateSpec> r = [] {
    using Messages = std::vector<ChatMessage>;
    Registry<ChatTemplateSpec> reg("data.chat_template");
    //                    id                  name     end_of_turn   tool_end  closes reasoning bos   thinking_off
    reg.add("none", {ChatTemplate::None, "none", "", "", true, false, false, nullptr, nullptr});
    reg.add("chatml", {ChatTemplate::ChatML, "chatml", "<|im_end|>", "", true, false, false, nullptr,
                       [](const Messages& m, const ChatFormat&, bool gen) { return render_chatml(m, gen); }});
    reg.add("llama3", {ChatTemplate::Llama3, "llama3", "<|eot_id|>", "", true, false, true, nullptr,
                       [](const Messages& m, const ChatFormat& f, bool gen) { return render_llama3(m, f.bos_token, gen); }});
    reg.add("qwen3", {ChatTemplate::Qwen3, "qwen3", "<|im_end|>", "", true, true, false, "<think>\n\n</think>\n\n",
                      [](const Messages& m, const ChatFormat& f, bool gen) {
                        return render_qwen3(m, f.enable_thinking, gen);
                      }});
    reg.add("qwen3_5", {ChatTemplate::Qwen3_5, "qwen3_5", "<|im_end|>", "", true, true, false,
                        "<think>\n\n</think>\n\n", [](const Messages& m, const ChatFormat& f, bool gen) {
                          return render_qwen3_5(m, f.enable_thinking, gen);
                        }});
    reg.add("glm45", {ChatTemplate::Glm45, "glm45", "<|user|>", "<|observation|>", false, true, false,
                      "\n<think></think>", [](const Messages& m, const ChatFormat& f, bool gen) {
                        return render_glm45(m, f.enable_thinking, gen);
                      }});
    reg.add("glm47", {ChatTemplate::Glm47, "glm47", "<|user|>", "<|observation|>", false, true, false, "</think>",
                      [](const Messages& m, const ChatFormat& f, bool gen) {
                        return render_glm47(m, f.enable_thinking, gen);
                      }});
    reg.add("deepseek_r1", {ChatTemplate::DeepSeekR1, "deepseek_r1", "<｜end▁of▁sentence｜>", "", true, false, true,
                            nullptr, [](const Messages& m, const ChatFormat& f, bool gen) {
                              return render_deepseek_r1(m, f.bos_token, gen);
                            }});
    reg.add("deepseek_v3", {ChatTemplate::DeepSeekV3, "deepseek_v3", "<｜end▁of▁sentence｜>", "", true, false, true,
                            nullptr, [](const Messages& m, const ChatFormat& f, bool gen) {
                              return render_deepseek_v3(m, f.bos_token, gen);
                            }});
    return reg;
  }();
  return r;
}

const ChatTemplateSpec& chat_template_spec(ChatTemplate t) {
  for (const std::string& name : chat_templates().names())
    if (chat_templates().get(name).id == t) return chat_templates().get(name);
  SLIMPI_FAIL("chat template {} has no registry entry", int(t));
}

std::string ChatFormat::end_of_turn() const { return chat_template_spec(chat_template).end_of_turn; }

std::vector<std::string> ChatFormat::turn_ends() const {
  const ChatTemplateSpec& s = chat_template_spec(chat_template);
  std::vector<std::string> ends{s.end_of_turn};
  if (*s.tool_end_of_turn) ends.push_back(s.tool_end_of_turn);
  return ends;
}

ChatTemplate parse_chat_template(const std::string& name) { return chat_templates().get(name).id; }

const char* chat_template_name(ChatTemplate t) { return chat_template_spec(t).name; }

std::optional<ChatTemplate> recognise_chat_template(const std::string& jinja) {
  const auto has = [&](const char* marker) { return jinja.find(marker) != std::string::npos; };
  if (has("<|im_start|>") && has("<think>") && has("<function=") && has("<parameter=")) {
    if (has("enable_thinking is false")) return ChatTemplate::Qwen3_5;
    return std::nullopt;  // (Qwen3.5-0.8B / 2B: thinking off unless asked for)
  }
  // (Qwen3-2507 Thinking's, which Qwen3-Next-Thinking ships, always opens with <think>: no switch, not qwen3)
  if (has("<|im_start|>") && has("<think>")) return has("enable_thinking") ? std::optional(ChatTemplate::Qwen3) : std::nullopt;
  if (has("<|im_start|>")) return ChatTemplate::ChatML;
  if (has("<|start_header_id|>") && has("<|eot_id|>")) return ChatTemplate::Llama3;
  if (has("[gMASK]<sop>") && has("<|observation|>") && has("'\\n<think></think>'")) return ChatTemplate::Glm45;
  if (has("[gMASK]<sop>") && has("<|observation|>") && has("clear_thinking") && has("else '<think>'") &&
      !has("reasoning_effort"))
    return ChatTemplate::Glm47;
  if (has("<｜User｜>") && has("<｜Assistant｜>") && has("<think>\\n")) return ChatTemplate::DeepSeekR1;
  if (has("<｜User｜>") && has("<｜Assistant｜>") && has("is_first_sp") && !has("<think>") &&
      !has("</think>"))  // (R1-style templates that drop reasoning with content.split('</think>') are not it)
    return ChatTemplate::DeepSeekV3;
  return std::nullopt;
}

namespace {

// "chatml, llama3, ...": the templates that render something, for messages.
std::string rendering_templates() {
  std::vector<std::string> names;
  for (const std::string& name : chat_templates().names())
    if (name != "none") names.push_back(name);
  return fmt::format("{}", fmt::join(names, ", "));
}

// data.chat_template, with "auto" resolved against the model's shipped template.
ChatTemplate chosen_template(const Deck& deck, const Tokenizer& tokenizer) {
  const std::string& name = deck.get_string("data.chat_template");
  if (name != "auto") return parse_chat_template(name);
  const Tokenizer::ShippedTemplate shipped = tokenizer.shipped_chat_template();
  if (shipped.text.empty()) return ChatTemplate::None;
  if (auto t = recognise_chat_template(shipped.text)) return *t;
  SLIMPI_FAIL_ALL("data.chat_template = \"auto\" ({}): the chat template in {} is not one slimpi implements "
                  "({}); name one of them if it renders the same, or \"none\"",
                  deck.source("data.chat_template"), shipped.source, rendering_templates());
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
                    "renders none ({}); choose one of {}",
                    deck.source("data.system_prompt"), deck.source("data.chat_template"), rendering_templates());
  const ChatTemplateSpec& spec = chat_template_spec(f.chat_template);
  if (!f.enable_thinking && spec.thinking_off == nullptr)
    SLIMPI_FAIL_ALL("data.enable_thinking = false ({}) is a switch of the qwen3, qwen3_5, glm45 and glm47 templates; "
                    "data.chat_template = {} ({}) has none",
                    deck.source("data.enable_thinking"), chat_template_name(f.chat_template),
                    deck.source("data.chat_template"));
  if (spec.needs_bos) {
    f.bos_token = tokenizer.bos_token();
    if (f.bos_token.empty())
      SLIMPI_FAIL_ALL("data.chat_template = {} ({}) starts every conversation with the tokenizer's bos_token, "
                      "but {} has none (tokenizer_config.json: bos_token)",
                      chat_template_name(f.chat_template), deck.source("data.chat_template"), tokenizer.describe());
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
      } else if (key == "reasoning_content" && chat_template_spec(t).reads_reasoning) {
        if (!v.is_null() && !v.is_string())
          return fmt::format("message {}: 'reasoning_content' must be a string, got {}", i, v.type_name());
        msg.has_reasoning = v.is_string();
        if (msg.has_reasoning) msg.reasoning = v.get<std::string>();
      } else {
        return fmt::format("message {}: key '{}' is not supported by the {} template (role, content{})", i, key,
                           chat_template_name(t), chat_template_spec(t).reads_reasoning ? ", reasoning_content" : "");
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
  if (t == ChatTemplate::Qwen3_5) {  // what Qwen3.5's template raises on
    for (size_t i = 1; i < out->size(); ++i)
      if ((*out)[i].role == "system")
        return fmt::format("message {}: a system message after the first (the qwen3_5 template raises 'System "
                           "message must be at the beginning.')", i);
    if (!has_user_query(*out))
      return "no user message that is not a <tool_response> (the qwen3_5 template raises 'No user query found in "
             "messages.')";
  }
  return "";
}

std::string render_chat(std::vector<ChatMessage> messages, const ChatFormat& f, bool add_generation_prompt) {
  SLIMPI_CHECK(f.enabled(), "render_chat: no chat template");
  SLIMPI_CHECK(!messages.empty(), "render_chat: no messages");
  if (!f.system_prompt.empty() && messages.front().role != "system")
    messages.insert(messages.begin(), ChatMessage{"system", f.system_prompt, false, ""});
  return chat_template_spec(f.chat_template).render(messages, f, add_generation_prompt);
}

}  // namespace slimpi
