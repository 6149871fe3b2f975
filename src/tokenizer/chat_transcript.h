// ChatTranscript — a multi-turn episode's conversation under its chat template, so that
// each observation is appended as the template's delta for its new messages (token-in /
// token-out: the model's tokens are never decoded and re-encoded; only the delta is
// tokenised, once).
//
// It keeps the conversation: a stand-in user message for the prompt, then the model's
// turns (as assistant messages) and the observations' messages. With P the render of the
// conversation before the model's latest turn (with the generation prompt: what opened
// that turn) and F the render of the conversation with the turn and the new messages
// (with the generation prompt: what opens the next), the delta is F after the turn's
// end-of-turn marker (the marker included when the model did not sample it: a turn cut
// by a stop string or its token limit). F must start with P: a template that renders the
// earlier conversation differently once the turn and the observation exist (it rewrites
// history: Qwen3 without thinking opens each turn with an empty <think> block and renders
// an earlier turn without it) is refused with both texts at the first difference, never
// silently re-tokenised. The model's own text is not compared with its rendering (Llama
// 3 trims a turn's whitespace; the token stream keeps what was sampled).
// Without a template (data.chat_template = "none") a tool message is appended as
// "<tool_response>\n{content}\n</tool_response>\n" and any other as "{content}\n".
// Owned by one episode (rollout/episode_runner.h), saved with it in a checkpoint when
// its environment takes snapshots; not thread-safe.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/chat_template.h"

namespace slimpi {

class ChatTranscript {
 public:
  explicit ChatTranscript(const ChatFormat& format);

  // The model's turn: its text (decoded, without the token that stopped it) and the
  // turn end it sampled (one of ChatFormat::turn_ends(), as one token; "" = none: a stop
  // string, another stop token or the token limit ended it).
  void add_model_turn(const std::string& text, const std::string& sampled_end);
  // The text to append for the observation's messages; "" and *error set when the
  // template rewrites the history the stream already holds.
  std::string add_observation(const std::vector<ChatMessage>& messages, std::string* error);

  // The whole state as JSON text (a checkpoint's), and back under the same format;
  // load() throws, saying what is wrong, on a text save() did not write or one saved
  // under another template (or data.enable_thinking).
  std::string save() const;
  static ChatTranscript load(const ChatFormat& format, const std::string& saved);

 private:
  ChatFormat format_;
  std::vector<ChatMessage> conversation_;
  std::string opened_;         // P: the render that opened the latest model turn
  std::string sampled_end_;    // the turn end the latest turn sampled ("" = none)
};

}  // namespace slimpi
