// Anthropic Messages on the agent endpoint (agent/agent_environment.h, POST /v1/messages):
// the body an Anthropic client sends, read into the same conversation as an OpenAI chat
// completion (agent/openai_chat.h), and the model's turn written back as a message object
// or as its stream of events. Pure functions; no I/O.
//
// Read: `system` (a string or text blocks) as the first system message; a user message's
// tool_result blocks as tool messages (in order, before its text), an assistant message's
// tool_use blocks as its tool calls (input as the arguments), text blocks joined; thinking
// blocks dropped (the model's own, sent back); other block types refused (400). `tools`
// ({name, description, input_schema}) as OpenAI function tools, so that the chat template
// writes them as it writes OpenAI's. Written: a thinking block (the turn's reasoning), a text
// block, tool_use blocks (ids "toolu_<turn>_<k>"); stop_reason tool_use, end_turn or max_tokens.
#pragma once

#include <optional>
#include <string>

#include "agent/openai_chat.h"

namespace slimpi {

// {"type": "error", "error": {"type": ..., "message": ...}}, the type from the status
// (400 invalid_request_error, 401 authentication_error, 404 not_found_error,
// 413 request_too_large, 429 rate_limit_error).
std::string anthropic_error_body(const ApiError& e);
// The error in the API a request came in: Anthropic's form, or OpenAI's.
std::string api_error_body(const ApiError& e, bool anthropic);

// Parses and checks a body (max_tokens required, as the API requires it; temperature,
// top_p, top_k, stop_sequences checked for their types and ranges, then, as for chat
// completions, the deck's rollout settings sample); nullopt when it is one slimpi serves.
std::optional<ApiError> parse_anthropic_messages(const std::string& body, ChatCompletionRequest* out);

std::string anthropic_message_json(const AssistantTurn& turn, const std::string& id, const std::string& model);
// message_start, each block's content_block_start / _delta / _stop, message_delta, message_stop.
std::string anthropic_message_events(const AssistantTurn& turn, const std::string& id, const std::string& model);

}  // namespace slimpi
