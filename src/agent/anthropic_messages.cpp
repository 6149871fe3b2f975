#include "agent/anthropic_messages.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace slimpi {
namespace {

using ojson = nlohmann::ordered_json;

// A block list's text blocks joined (or the string itself); other block types refused.
std::optional<ApiError> text_of(const ojson& v, const std::string& where, std::string* out) {
  out->clear();
  if (v.is_string()) {
    *out = v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array()) return invalid_request(where, fmt::format("must be a string or a list of text blocks, not {}", v.type_name()));
  for (size_t k = 0; k < v.size(); ++k) {
    if (string_field(v[k], "type") != "text" || !v[k].contains("text") || !v[k]["text"].is_string())
      return invalid_request(fmt::format("{}[{}]", where, k), "only text blocks are served here (this is a text model)");
    *out += v[k]["text"].get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> read_message(const ojson& m, const std::string& where, std::vector<AgentMessage>* out) {
  if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content"))
    return invalid_request(where, "a message must be an object with a string \"role\" and \"content\"");
  const std::string role = m["role"].get<std::string>();
  if (role != "user" && role != "assistant")
    return invalid_request(where + ".role", fmt::format("role \"{}\" is not one of user, assistant", role));
  AgentMessage msg{role, "", {}};
  const ojson& c = m["content"];
  if (c.is_string()) {
    msg.content = c.get<std::string>();
    out->push_back(std::move(msg));
    return std::nullopt;
  }
  if (!c.is_array()) return invalid_request(where + ".content", "content must be a string or a list of blocks");
  for (size_t k = 0; k < c.size(); ++k) {
    const ojson& b = c[k];
    const std::string at = fmt::format("{}.content[{}]", where, k);
    const std::string type = string_field(b, "type");
    if (type == "text" && b.contains("text") && b["text"].is_string()) {
      msg.content += b["text"].get<std::string>();
    } else if (role == "user" && type == "tool_result") {
      AgentMessage result{"tool", "", {}};
      if (b.contains("content") && !b["content"].is_null())
        if (auto e = text_of(b["content"], at + ".content", &result.content)) return e;
      out->push_back(std::move(result));  // tool results first, as the API requires them first
    } else if (role == "assistant" && type == "tool_use") {
      if (!b.contains("name") || !b["name"].is_string()) return invalid_request(at + ".name", "a tool_use block needs a string name");
      const ojson input = b.contains("input") ? b["input"] : ojson::object();
      if (!input.is_object()) return invalid_request(at + ".input", "a tool_use block's input must be an object");
      msg.tool_calls.push_back({string_field(b, "id"), b["name"].get<std::string>(), python_json_dumps(input)});
    } else if (role == "assistant" && (type == "thinking" || type == "redacted_thinking")) {
      continue;  // the model's reasoning sent back: the stream has it already
    } else {
      return invalid_request(at, fmt::format("a {} block in a {} message is not served (text, tool_use, tool_result)",
                                 type.empty() ? "malformed" : type, role));
    }
  }
  if (role == "assistant" || !msg.content.empty() || out->empty() || out->back().role != "tool")
    out->push_back(std::move(msg));
  return std::nullopt;
}

const char* stop_reason(const AssistantTurn& t) {
  return !t.tool_calls.empty() ? "tool_use" : t.finish_reason == "length" ? "max_tokens" : "end_turn";
}

std::string tool_use_id(const std::string& call_id) { return "toolu_" + call_id.substr(call_id.find('_') + 1); }

ojson input_of(const AgentToolCall& c) {
  const ojson v = ojson::parse(c.arguments_json, nullptr, false);
  return v.is_object() ? v : ojson::object();
}

}  // namespace

std::string api_error_body(const ApiError& e, bool anthropic) {
  return anthropic ? anthropic_error_body(e) : openai_error_body(e);
}

std::string anthropic_error_body(const ApiError& e) {
  const char* type = e.status == 401   ? "authentication_error"
                     : e.status == 403 ? "permission_error"
                     : e.status == 404 ? "not_found_error"
                     : e.status == 413 ? "request_too_large"
                     : e.status == 429 ? "rate_limit_error"
                     : e.status >= 500 ? "api_error"
                                       : "invalid_request_error";
  return json_text(ojson{{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}});
}

std::optional<ApiError> parse_anthropic_messages(const std::string& body, ChatCompletionRequest* out) {
  *out = ChatCompletionRequest();
  const ojson j = ojson::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_request("", "the request body is not valid JSON");
  if (!j.is_object()) return invalid_request("", fmt::format("the request body must be a JSON object, not {}", j.type_name()));
  if (!j.contains("model") || !j["model"].is_string()) return invalid_request("model", "model: Field required (a string)");
  out->model = j["model"].get<std::string>();
  if (!j.contains("max_tokens") || !j["max_tokens"].is_number_integer() || j["max_tokens"].get<int64_t>() < 1)
    return invalid_request("max_tokens", "max_tokens: Field required (a positive integer)");
  if (j.contains("system") && !j["system"].is_null()) {
    AgentMessage sys{"system", "", {}};
    if (auto e = text_of(j["system"], "system", &sys.content)) return e;
    out->messages.push_back(std::move(sys));
  }
  if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty())
    return invalid_request("messages", "messages must be a non-empty list");
  for (size_t i = 0; i < j["messages"].size(); ++i)
    if (auto e = read_message(j["messages"][i], fmt::format("messages[{}]", i), &out->messages)) return e;
  if (j.contains("tools") && !j["tools"].is_null()) {
    if (!j["tools"].is_array()) return invalid_request("tools", "tools must be a list");
    for (size_t k = 0; k < j["tools"].size(); ++k) {
      const ojson& t = j["tools"][k];
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || (t.contains("type") && t["type"] != "custom"))
        return invalid_request(fmt::format("tools[{}]", k), "a tool must be {\"name\": ..., \"input_schema\": {...}} (client tools "
                                                "only: server tools are not served)");
      ojson function = {{"name", t["name"]}};
      if (t.contains("description")) function["description"] = t["description"];
      function["parameters"] = t.contains("input_schema") ? t["input_schema"] : ojson::object();
      out->tools.push_back(python_json_dumps(ojson{{"type", "function"}, {"function", function}}));
    }
  }
  if (j.contains("stream") && !j["stream"].is_null() && !j["stream"].is_boolean())
    return invalid_request("stream", "stream must be a boolean");
  out->stream = bool_field(j, "stream");
  if (auto e = check_number_field(j, "temperature", 0, 1)) return e;
  if (auto e = check_number_field(j, "top_p", 0, 1)) return e;
  if (auto e = check_number_field(j, "top_k", 0, 1e9)) return e;
  if (j.contains("stop_sequences") && !j["stop_sequences"].is_null()) {
    bool ok = j["stop_sequences"].is_array();
    for (const ojson& s : j["stop_sequences"]) ok = ok && s.is_string();
    if (!ok) return invalid_request("stop_sequences", "stop_sequences must be a list of strings");
  }
  return std::nullopt;
}

std::string anthropic_message_json(const AssistantTurn& turn, const std::string& id, const std::string& model) {
  ojson content = ojson::array();
  if (!turn.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", turn.reasoning}, {"signature", ""}});
  if (!turn.content.empty() || turn.tool_calls.empty()) content.push_back({{"type", "text"}, {"text", turn.content}});
  for (const AgentToolCall& c : turn.tool_calls)
    content.push_back({{"type", "tool_use"}, {"id", tool_use_id(c.id)}, {"name", c.name}, {"input", input_of(c)}});
  return json_text(ojson{{"id", id},
                    {"type", "message"},
                    {"role", "assistant"},
                    {"model", model},
                    {"content", content},
                    {"stop_reason", stop_reason(turn)},
                    {"stop_sequence", nullptr},
                    {"usage", {{"input_tokens", turn.prompt_tokens}, {"output_tokens", turn.completion_tokens}}}});
}

std::string anthropic_message_events(const AssistantTurn& turn, const std::string& id, const std::string& model) {
  std::string out;
  auto event = [&](const char* name, const ojson& data) { out += fmt::format("event: {}\ndata: {}\n\n", name, json_text(data)); };
  event("message_start", {{"type", "message_start"},
                          {"message", {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", model},
                                       {"content", ojson::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                                       {"usage", {{"input_tokens", turn.prompt_tokens}, {"output_tokens", 0}}}}}});
  int index = 0;
  auto block = [&](ojson start, ojson delta) {
    event("content_block_start", {{"type", "content_block_start"}, {"index", index}, {"content_block", std::move(start)}});
    event("content_block_delta", {{"type", "content_block_delta"}, {"index", index}, {"delta", std::move(delta)}});
    event("content_block_stop", {{"type", "content_block_stop"}, {"index", index}});
    ++index;
  };
  if (!turn.reasoning.empty())
    block({{"type", "thinking"}, {"thinking", ""}, {"signature", ""}},
          {{"type", "thinking_delta"}, {"thinking", turn.reasoning}});
  if (!turn.content.empty() || turn.tool_calls.empty())
    block({{"type", "text"}, {"text", ""}}, {{"type", "text_delta"}, {"text", turn.content}});
  for (const AgentToolCall& c : turn.tool_calls)
    block({{"type", "tool_use"}, {"id", tool_use_id(c.id)}, {"name", c.name}, {"input", ojson::object()}},
          {{"type", "input_json_delta"}, {"partial_json", json_text(input_of(c))}});
  event("message_delta", {{"type", "message_delta"},
                          {"delta", {{"stop_reason", stop_reason(turn)}, {"stop_sequence", nullptr}}},
                          {"usage", {{"output_tokens", turn.completion_tokens}}}});
  event("message_stop", {{"type", "message_stop"}});
  return out;
}

}  // namespace slimpi
