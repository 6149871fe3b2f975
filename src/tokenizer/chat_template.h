// Chat templates — a conversation (a list of role/content messages) rendered as the
// prompt text a chat model was trained on, the way Hugging Face transformers'
// apply_chat_template renders these models' Jinja templates (checked against it on
// the conversations of tests/fixtures/chat):
//   chatml       Qwen2 / Qwen2.5 ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n" per
//                message; tool results as a user turn of <tool_response> blocks
//   llama3       Llama 3 Instruct: bos_token, then "<|start_header_id|>{role}<|end_header_id|>
//                \n\n{content stripped}<|eot_id|>" per message
//   qwen3        Qwen3: ChatML with the <think> rules (reasoning of assistant turns after the
//                last user query is kept as a <think> block; the rest is dropped) and
//                enable_thinking (false: an empty <think> block opens the generation)
//   qwen3_5      Qwen3.5 (qwen3_5, qwen3_5_moe; the template of its 4B and larger models): qwen3's
//                turns with every content stripped, a <think> block on every assistant turn
//                after the last user query (empty when it has no reasoning), the generation
//                opened with "<think>\n" (an empty block when thinking is off); a system
//                message only first and a conversation with a user query, as its template
//                raises otherwise (refused by parse_chat_messages)
//   glm45        GLM-4.5 / GLM-4.5-Air (glm4_moe): "[gMASK]<sop>", <|system|> <|user|>
//                <|assistant|> <|observation|> openers and no closing marker (the next
//                message's opener ends a turn); every assistant turn has a <think> block;
//                enable_thinking (false: "/nothink" after each user message, an empty
//                <think></think> opens the generation)
//   glm47        GLM-4.7 / GLM-4.7-Flash (glm4_moe_lite): glm45's markers without the
//                newlines; a turn without kept reasoning opens with "</think>"; the
//                generation opens with "<think>" ("</think>" when thinking is off)
//   deepseek_r1  DeepSeek-R1 (deepseek_v3): bos_token, the system prompt, <｜User｜> and
//                <｜Assistant｜> turns closed by <｜end▁of▁sentence｜>, tool outputs; the
//                generation opens with "<think>\n" and an earlier turn's reasoning is dropped
//                (so a multi-turn episode under it is refused: ChatTranscript)
//   deepseek_v3  DeepSeek-V3-0324 (deepseek_v3): deepseek_r1's markers, every system message
//                joined by a blank line, turns as written, the generation opened with
//                <｜Assistant｜> alone
// chat_renderers.cpp has each one's rules. ChatFormat::system_prompt is a slimpi option, not
// part of any template: a system message put first when the conversation has none
// (Qwen2.5-Instruct's template does this with "You are Qwen, created by Alibaba Cloud. You
// are a helpful assistant.").
// A generation stops at the end-of-turn marker when the vocabulary has it as one token
// (RolloutConfig adds its id to the stop ids; GLM's <|observation|> too); an SFT reply is
// trained up to and with it (a GLM reply gets <|user|>, which the next message would
// open with), plus the vocabulary's EOS where the marker is not one token (the byte
// tokenizer).
// Roles: system, user, assistant, and tool (chatml and qwen3: a user turn of
// <tool_response> blocks). Llama 3 (3.0's template) has no tool role for prompts; a
// multi-turn environment's tool results render as Llama 3.1's ipython turn. Structured
// tool_calls fields, multimodal content and other roles are refused with a message, never
// rendered differently (a model's tool calls stay in its text: tokenizer/tool_calls.h).
// Pure functions; no state.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/registry.h"

namespace slimpi {

class Deck;
class Tokenizer;

struct ChatMessage {
  std::string role;
  std::string content;
  bool has_reasoning = false;  // reasoning_content given (qwen3, qwen3_5, glm45, glm47), possibly ""
  std::string reasoning;
};

enum class ChatTemplate { None, ChatML, Llama3, Qwen3, Qwen3_5, Glm45, Glm47, DeepSeekR1, DeepSeekV3 };

struct ChatFormat {
  ChatTemplate chat_template = ChatTemplate::None;
  std::string system_prompt;     // "" = none
  bool enable_thinking = true;   // qwen3, qwen3_5, glm45 and glm47
  std::string bos_token;         // llama3, deepseek_r1, deepseek_v3: the text the template starts with

  bool enabled() const { return chat_template != ChatTemplate::None; }
  // The text that ends an assistant turn: "<|im_end|>" (chatml, qwen3), "<|eot_id|>" (llama3),
  // "<|user|>" (glm45, glm47), "<｜end▁of▁sentence｜>" (deepseek_r1, deepseek_v3).
  std::string end_of_turn() const;
  // Every text that can end an assistant turn: end_of_turn(), and glm45's <|observation|>
  // (the turn before tool results).
  std::vector<std::string> turn_ends() const;
  // From data.chat_template, data.system_prompt and data.enable_thinking; checks that
  // they fit together and with the tokenizer (llama3 needs its bos_token). "auto" is
  // the template the model ships when slimpi recognises it, none when it ships none,
  // and an error when it ships one slimpi does not implement.
  static ChatFormat from_deck(const Deck& deck, const Tokenizer& tokenizer);
};

// The built-in templates, keyed by data.chat_template's names ("auto" is not one: it
// resolves to one of these, ChatFormat::from_deck). A new template is a render function
// and one add() in chat_templates().
struct ChatTemplateSpec {
  ChatTemplate id;
  const char* name;
  const char* end_of_turn;       // the text that ends an assistant turn ("" for none)
  const char* tool_end_of_turn;  // what ends a turn followed by tool results, when not end_of_turn ("" = same)
  bool reply_closes_itself;      // a rendered assistant turn ends with end_of_turn (GLM: the next opener does)
  bool reads_reasoning;          // accepts an assistant message's reasoning_content (qwen3, qwen3_5, glm45, glm47)
  bool needs_bos;                // starts with the tokenizer's bos_token (llama3, deepseek_r1, deepseek_v3)
  const char* thinking_off;      // the generation prompt's tail under enable_thinking = false;
                                 // nullptr = the template has no thinking switch
  std::string (*render)(const std::vector<ChatMessage>& messages, const ChatFormat& format, bool add_generation_prompt);
};
const Registry<ChatTemplateSpec>& chat_templates();
const ChatTemplateSpec& chat_template_spec(ChatTemplate t);

ChatTemplate parse_chat_template(const std::string& name);  // throws on an unknown name ("auto" included)
const char* chat_template_name(ChatTemplate t);

// Which built-in template a model's shipped Jinja template is, by the markers it writes:
// <|im_start|> with <think> and <function=...> tool calls opening the generation with
// <think> unless thinking is off = qwen3_5 (its 0.8B/2B variant, thinking off unless
// asked, is not), <|im_start|> with <think> and the enable_thinking switch = qwen3 (Qwen3-2507
// Thinking's, always opening with <think>, is not), <|im_start|> = chatml, <|start_header_id|> with
// <|eot_id|> = llama3, [gMASK]<sop> with <|observation|> and '\n<think></think>' = glm45,
// [gMASK]<sop> with <|observation|>, clear_thinking and an "else '<think>'" generation
// prompt but no reasoning_effort = glm47 (GLM-5's templates are neither), <｜User｜> and
// <｜Assistant｜> with '<think>\n' = deepseek_r1, with is_first_sp (V3-0324's joined system
// prompts) and no <think> = deepseek_v3 (DeepSeek-V3's first template, which keeps only the
// last system message, is neither); nullopt for anything else (or no text).
std::optional<ChatTemplate> recognise_chat_template(const std::string& jinja);

// One log line when the model ships a chat template and data.chat_template does not
// render it ("none", or another template), or when "auto" picked one; "" otherwise.
std::string describe_chat_template_choice(const Deck& deck, const Tokenizer& tokenizer);

// A JSON message list ([{"role": ..., "content": ...}, ...]) as messages; a string is
// one user message. Returns "" on success, else what is wrong (the caller adds file:line).
std::string parse_chat_messages(const nlohmann::json& value, ChatTemplate t, std::vector<ChatMessage>* out);

// The prompt text; add_generation_prompt opens the assistant turn the model continues.
std::string render_chat(std::vector<ChatMessage> messages, const ChatFormat& format, bool add_generation_prompt);

// Python's str.strip() (Unicode whitespace at both ends), as Jinja's trim filter.
std::string strip_unicode_whitespace(const std::string& s);

}  // namespace slimpi
