// The render functions of the built-in chat templates (tokenizer/chat_template.h names
// them and says what each renders; chat_renderers.cpp has the rules, message by message).
// Messages are already checked (parse_chat_messages); the system prompt is already put
// first (render_chat). Pure functions.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/chat_template.h"

namespace slimpi {

std::string render_chatml(const std::vector<ChatMessage>& m, bool gen);
std::string render_llama3(const std::vector<ChatMessage>& m, const std::string& bos, bool gen);
std::string render_qwen3(const std::vector<ChatMessage>& m, bool enable_thinking, bool gen);
std::string render_qwen3_5(const std::vector<ChatMessage>& m, bool enable_thinking, bool gen);
// Whether a conversation has a user message that is not a <tool_response> (content
// stripped): the qwen3_5 template raises without one.
bool has_user_query(const std::vector<ChatMessage>& m);
std::string render_glm45(const std::vector<ChatMessage>& m, bool enable_thinking, bool gen);
std::string render_glm47(const std::vector<ChatMessage>& m, bool enable_thinking, bool gen);
std::string render_deepseek_r1(const std::vector<ChatMessage>& m, const std::string& bos, bool gen);
std::string render_deepseek_v3(const std::vector<ChatMessage>& m, const std::string& bos, bool gen);

}  // namespace slimpi
