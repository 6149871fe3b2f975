// OpenAI Chat Completions on the agent endpoint (agent/agent_environment.h): the body a
// client POSTs to /v1/chat/completions, parsed and checked into the conversation slimpi
// renders, and the model's turn written back as a chat.completion object or as its
// server-sent events (stream: true). Pure functions; no I/O.
//
// What a turn becomes (AssistantTurn): with a template that reads reasoning (qwen3,
// qwen3_5, glm45, glm47) the text before "</think>" is `reasoning_content`; the tool calls
// parsed from the text in the family's format (tokenizer/tool_calls.h) become `tool_calls`
// (ids "call_<turn>_<k>", arguments as JSON text) and leave `content`; a malformed call
// stays in `content` as written; with anything taken out, `content` is trimmed. Texts are
// as the client receives them (invalid UTF-8 as U+FFFD); the token stream keeps the bytes
// sampled. finish_reason: tool_calls, stop or length.
//
// What a conversation becomes (conversation_messages): system ("developer" too), user
// and tool messages as role and text (text parts joined; no images); `tools` are written
// into the system message the way Qwen's templates write them (the "# Tools" block with
// one JSON object per line; chatml, qwen3 and none only); an assistant message's
// tool_calls (a history the agent brings) as Qwen's <tool_call> blocks after its text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/chat_template.h"

namespace slimpi {

struct ToolCall;

// A model turn as the episode runner hands it to the environment (env/environment.h's
// EpisodeAction): its text without the stop token, the tool calls parsed from it.
struct ModelTurn {
  const std::string& text;
  const std::vector<ToolCall>& tool_calls;
  const std::string& finish_reason;  // "stop" or "length"
  int64_t turn = 0;                  // the episode's model turn, 1 for the first
  int64_t context_tokens = 0, new_tokens = 0;
  // Each sampled token's bytes alone and its log-probability under the rollout's sampling
  // (the turn's rollout_log_probs), the stop token excluded; nullptr = not given.
  const std::vector<std::string>* token_texts = nullptr;
  const std::vector<float>* log_probs = nullptr;
};

// An error as the OpenAI API returns it: the HTTP status and
// {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string code;     // "" = null
  std::string message;
  std::string param;    // the request field at fault ("" = null)
};
ApiError api_error(int status, std::string type, std::string code, std::string message, std::string param = "");
// A 400 invalid_request_error naming the field at fault.
ApiError invalid_request(std::string param, std::string message);
std::string openai_error_body(const ApiError& e);

// Shared by both APIs' parsers: a number field within [lo, hi] when present (a 400 else),
// and a JSON value as the text a client receives (invalid UTF-8 as U+FFFD).
std::optional<ApiError> check_number_field(const nlohmann::ordered_json& body, const char* key, double lo, double hi);
std::string json_text(const nlohmann::ordered_json& value);
// A request's field read without throwing: the string (else ""), the boolean (else false:
// missing, null or another type; the type checks that answer 400 come first).
std::string string_field(const nlohmann::ordered_json& object, const char* key);
bool bool_field(const nlohmann::ordered_json& object, const char* key);
// top_logprobs: only 0 is served (the engine records the sampled token's log-probability alone).
std::optional<ApiError> check_top_logprobs(const nlohmann::ordered_json& body);
// A tool call's arguments text (a JSON object) in json.dumps's form; not JSON: kept as written.
std::string canonical_arguments(const std::string& text);

struct AgentToolCall {
  std::string id;              // "call_<turn>_<k>"
  std::string name;
  std::string arguments_json;  // the arguments object as Python's json.dumps writes it
};

// A message of the conversation as the agent sent it: text parts joined, null content "".
struct AgentMessage {
  std::string role;  // system ("developer" is read as system), user, assistant, tool
  std::string content;
  std::vector<AgentToolCall> tool_calls;  // assistant only
  // The same message for a session's history: role, content, and the tool calls' names
  // and arguments as JSON values (ids, tool_call_id and reasoning are not compared: agents
  // drop or rewrite them).
  bool same_as(const AgentMessage& other) const;
};

struct ChatCompletionRequest {
  std::string model;
  std::vector<AgentMessage> messages;
  std::vector<std::string> tools;  // each tool object as Python's json.dumps writes it (key order kept)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // the answer gives each sampled token's log-probability
};
// Parses and checks a body; nullopt when it is a request slimpi serves. Sampling fields
// (temperature, top_p, seed, stop, max_tokens, max_completion_tokens, top_logprobs,
// tool_choice) are checked for their types and ranges; the episode samples with the deck's
// rollout settings (docs/agents.md says why), so they change nothing.
std::optional<ApiError> parse_chat_completion(const std::string& body, ChatCompletionRequest* out);

// One sampled token of a turn as the APIs' logprobs give it: {"token": its text as received,
// "logprob", "bytes": its bytes, "top_logprobs": []}.
struct TokenLogprob {
  std::string bytes;
  float logprob = 0;
};
nlohmann::ordered_json token_logprob_json(const TokenLogprob& t);

// The model's turn as the API returns it.
struct AssistantTurn {
  std::string content;    // the text outside the reasoning and the parsed tool calls
  std::string reasoning;  // "" = none
  std::vector<AgentToolCall> tool_calls;
  std::string finish_reason;  // "tool_calls", "stop" or "length"
  int64_t prompt_tokens = 0, completion_tokens = 0;
  std::vector<TokenLogprob> logprobs;  // every token sampled (reasoning and tool calls included), the stop token not
};
// The tool calls' ids carry the turn's number.
AssistantTurn assistant_turn(const ModelTurn& action, ChatTemplate t);
// The assistant message a client sends back for this turn.
AgentMessage as_message(const AssistantTurn& turn);

// A chat.completion object, and the same turn as chat.completion.chunk events ending
// with "data: [DONE]" (a usage chunk before it when include_usage).
// with_logprobs: choices[0].logprobs.content has the turn's tokens (null else).
std::string chat_completion_json(const AssistantTurn& turn, const std::string& id, const std::string& model,
                                 int64_t created, bool with_logprobs = false);
std::string chat_completion_events(const AssistantTurn& turn, const std::string& id, const std::string& model,
                                   int64_t created, bool include_usage, bool with_logprobs = false);

// The conversation as the chat template renders it (see above): one message per agent
// message, after a system message put first for `tools` when the conversation has none.
// "" on success, else what is wrong (the client's error: a 400).
std::string conversation_messages(const std::vector<AgentMessage>& messages, const std::vector<std::string>& tools,
                                  const ChatFormat& format, std::vector<ChatMessage>* out);

// Python's json.dumps(value, ensure_ascii=False): ", " and ": " separators, key order
// kept, non-ASCII as is (Jinja's tojson in transformers' chat templates).
std::string python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace slimpi
