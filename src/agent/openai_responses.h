// OpenAI Responses on the agent endpoint (agent/agent_environment.h, POST /v1/responses):
// the text and function-call subset, read into the same conversation as a chat completion
// (agent/openai_chat.h) and the model's turn written back as a response object or as its
// server-sent events. Pure functions; no I/O.
//
// Read: `instructions` as the first system message; `input` a string (one user message)
// or a list of items: messages (roles system, developer, user, assistant; content a string
// or input_text / output_text parts), function_call items (joined to the assistant message
// they follow, or an assistant message of their own), function_call_output items as tool
// messages, reasoning items dropped (the model's own, sent back); `tools` of type
// "function" ({name, description, parameters}) as chat completions' function tools.
// `previous_response_id` names the session's latest response: the environment puts the
// session's history before `input` (the stored conversation; only the latest is kept).
// Written: a reasoning item (the turn's reasoning as reasoning_text), a message item with
// one output_text part, function_call items (call_id "call_<turn>_<k>"); status completed,
// or incomplete (reason max_output_tokens) for a turn cut at its token limit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "agent/openai_chat.h"

namespace slimpi {

struct ResponsesRequest {
  ChatCompletionRequest chat;        // model, messages (without the stored history), tools, stream,
                                     // logprobs (include has "message.output_text.logprobs")
  std::string previous_response_id;  // "" = none
  bool has_instructions = false;     // chat.messages[0] is `instructions`
};

// Parses and checks a body; nullopt when it is a request slimpi serves. Sampling fields
// (temperature, top_p, max_output_tokens, top_logprobs) are checked for their types and
// ranges and, as for chat completions, not applied; store, metadata, reasoning, text,
// tool_choice, parallel_tool_calls, truncation, user are accepted; background,
// conversation and tools other than functions are refused.
std::optional<ApiError> parse_responses_request(const std::string& body, ResponsesRequest* out);

// A response object, and the same turn as its events (response.created ...
// response.completed), each "event: <type>\ndata: {...}" with its sequence_number.
std::string response_json(const AssistantTurn& turn, const std::string& id, const std::string& model, int64_t created,
                          bool with_logprobs);
std::string response_events(const AssistantTurn& turn, const std::string& id, const std::string& model,
                            int64_t created, bool with_logprobs);

}  // namespace slimpi
