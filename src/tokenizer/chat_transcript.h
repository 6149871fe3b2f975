// ChatTranscript — the text a multi-turn episode's token stream stands for, so that
// each observation is appended as the chat template's delta for its new messages
// (token-in / token-out: the model's tokens are never re-tokenised; only the delta is
// tokenised, once).
//
// It keeps the episode's conversation (a stand-in user message for the prompt, then
// the model's turns and the observations' messages) and the stream text: the prompt's
// generation prompt, each model turn's text, the template's end-of-turn marker where a
// stop token ended the turn, and every delta appended. An observation's delta is
// render(conversation + new messages, with the generation prompt) minus the stream
// text, and that render must start with the stream text: a template that renders an
// earlier turn differently once later messages exist (it rewrites history: Qwen3
// drops the <think> block of assistant turns, or writes an empty one only for the last)
// is refused with both texts at the first difference, never silently re-tokenised.
// Without a template (data.chat_template = "none") a tool message is appended as
// "<tool_response>\n{content}\n</tool_response>\n" and any other as "{content}\n".
// Owned by one episode (rollout/episode_runner.h); not thread-safe.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/chat_template.h"

namespace slimpi {

class ChatTranscript {
 public:
  explicit ChatTranscript(const ChatFormat& format);

  // The model's turn: its text (decoded, without the token that stopped it) and
  // whether a stop token (the end-of-turn marker or EOS) ended it.
  void add_model_turn(const std::string& text, bool ended_on_stop_token);
  // The text to append for the observation's messages; "" and *error set when the
  // template rewrites the history the stream already holds.
  std::string add_observation(const std::vector<ChatMessage>& messages, std::string* error);

 private:
  ChatFormat format_;
  std::vector<ChatMessage> conversation_;
  std::string stream_;
};

}  // namespace slimpi
