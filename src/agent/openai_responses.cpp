#include "agent/openai_responses.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace slimpi {
namespace {

using ojson = nlohmann::ordered_json;

// A message item's content: a string, or input_text / output_text (text) parts joined.
std::optional<ApiError> item_text(const ojson& c, const std::string& where, std::string* out) {
  out->clear();
  if (c.is_null()) return std::nullopt;
  if (c.is_string()) {
    *out = c.get<std::string>();
    return std::nullopt;
  }
  if (!c.is_array()) return invalid_request(where, fmt::format("content must be a string or a list of parts, not {}", c.type_name()));
  for (size_t k = 0; k < c.size(); ++k) {
    const ojson& p = c[k];
    const std::string type = string_field(p, "type");
    if ((type == "input_text" || type == "output_text" || type == "text") && p.contains("text") && p["text"].is_string()) {
      *out += p["text"].get<std::string>();
      continue;
    }
    return invalid_request(fmt::format("{}[{}]", where, k),
                           fmt::format("content parts of type \"{}\" are not served (input_text and output_text: this is a "
                                       "text model)", type.empty() ? "malformed" : type));
  }
  return std::nullopt;
}

// One input item appended to the conversation: function calls join the assistant message
// they follow (the items of one answer: its message, then its calls).
std::optional<ApiError> read_item(const ojson& it, const std::string& where, std::vector<AgentMessage>* out) {
  if (!it.is_object()) return invalid_request(where, "an input item must be an object");
  const std::string type = it.contains("type") ? string_field(it, "type") : it.contains("role") ? "message" : "";
  if (type == "message") {
    if (!it.contains("role") || !it["role"].is_string())
      return invalid_request(where + ".role", "a message item needs a string role");
    AgentMessage m;
    m.role = it["role"].get<std::string>();
    if (m.role == "developer") m.role = "system";
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
      return invalid_request(where + ".role", fmt::format("role \"{}\" is not one of system, developer, user, assistant", m.role));
    if (!it.contains("content")) return invalid_request(where + ".content", "a message item needs content");
    if (auto e = item_text(it["content"], where + ".content", &m.content)) return e;
    out->push_back(std::move(m));
    return std::nullopt;
  }
  if (type == "function_call") {
    for (const char* key : {"call_id", "name", "arguments"})
      if (!it.contains(key) || !it[key].is_string())
        return invalid_request(fmt::format("{}.{}", where, key), fmt::format("a function_call item needs a string {}", key));
    if (out->empty() || out->back().role != "assistant") out->push_back({"assistant", "", {}});
    out->back().tool_calls.push_back({it["call_id"].get<std::string>(), it["name"].get<std::string>(),
                                      canonical_arguments(it["arguments"].get<std::string>())});
    return std::nullopt;
  }
  if (type == "function_call_output") {
    if (!it.contains("call_id") || !it["call_id"].is_string())
      return invalid_request(where + ".call_id", "a function_call_output item needs a string call_id");
    if (!it.contains("output")) return invalid_request(where + ".output", "a function_call_output item needs output");
    AgentMessage m{"tool", "", {}};
    if (auto e = item_text(it["output"], where + ".output", &m.content)) return e;
    out->push_back(std::move(m));
    return std::nullopt;
  }
  if (type == "reasoning") return std::nullopt;  // the model's reasoning sent back: the stream has it already
  return invalid_request(where + ".type", fmt::format("input items of type \"{}\" are not served (message, function_call, "
                                                      "function_call_output, reasoning)", type.empty() ? "malformed" : type));
}

std::optional<ApiError> check_boolean(const ojson& j, const char* key) {
  if (!j.contains(key) || j[key].is_null() || j[key].is_boolean()) return std::nullopt;
  return invalid_request(key, fmt::format("{} must be a boolean, not {}", key, j[key].type_name()));
}

std::string item_id(const char* prefix, const std::string& response_id, size_t k) {
  return fmt::format("{}_{}_{}", prefix, response_id.substr(response_id.find('_') + 1), k);
}

ojson logprobs_json(const AssistantTurn& turn) {
  ojson out = ojson::array();
  for (const TokenLogprob& t : turn.logprobs) out.push_back(token_logprob_json(t));
  return out;
}

ojson text_part(const std::string& text, const AssistantTurn& turn, bool with_logprobs) {
  ojson p = {{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}};
  if (with_logprobs) p["logprobs"] = logprobs_json(turn);
  return p;
}

// The output items, complete.
ojson output_items(const AssistantTurn& turn, const std::string& id, bool with_logprobs) {
  ojson items = ojson::array();
  if (!turn.reasoning.empty())
    items.push_back({{"type", "reasoning"},
                     {"id", item_id("rs", id, 0)},
                     {"summary", ojson::array()},
                     {"content", ojson::array({{{"type", "reasoning_text"}, {"text", turn.reasoning}}})}});
  if (!turn.content.empty() || turn.tool_calls.empty())
    items.push_back({{"type", "message"},
                     {"id", item_id("msg", id, 0)},
                     {"status", "completed"},
                     {"role", "assistant"},
                     {"content", ojson::array({text_part(turn.content, turn, with_logprobs)})}});
  for (size_t k = 0; k < turn.tool_calls.size(); ++k) {
    const AgentToolCall& c = turn.tool_calls[k];
    items.push_back({{"type", "function_call"},
                     {"id", item_id("fc", id, k)},
                     {"call_id", c.id},
                     {"name", c.name},
                     {"arguments", c.arguments_json},
                     {"status", "completed"}});
  }
  return items;
}

bool incomplete(const AssistantTurn& turn) { return turn.tool_calls.empty() && turn.finish_reason == "length"; }

ojson response_object(const AssistantTurn& turn, const std::string& id, const std::string& model, int64_t created,
                      const ojson& output, const char* status) {
  const bool done = std::string(status) != "in_progress";
  return {{"id", id},
          {"object", "response"},
          {"created_at", created},
          {"status", status},
          {"error", nullptr},
          {"incomplete_details", done && incomplete(turn) ? ojson{{"reason", "max_output_tokens"}} : ojson()},
          {"instructions", nullptr},
          {"model", model},
          {"output", output},
          {"parallel_tool_calls", true},
          {"tool_choice", "auto"},
          {"tools", ojson::array()},
          {"usage", done ? ojson{{"input_tokens", turn.prompt_tokens},
                                 {"input_tokens_details", {{"cached_tokens", 0}}},
                                 {"output_tokens", turn.completion_tokens},
                                 {"output_tokens_details", {{"reasoning_tokens", 0}}},
                                 {"total_tokens", turn.prompt_tokens + turn.completion_tokens}}
                         : ojson()}};
}

}  // namespace

std::optional<ApiError> parse_responses_request(const std::string& body, ResponsesRequest* out) {
  *out = ResponsesRequest();
  ChatCompletionRequest& chat = out->chat;
  const ojson j = ojson::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_request("", "the request body is not valid JSON");
  if (!j.is_object()) return invalid_request("", fmt::format("the request body must be a JSON object, not {}", j.type_name()));
  if (!j.contains("model") || !j["model"].is_string()) return invalid_request("model", "model (a string) is required");
  chat.model = j["model"].get<std::string>();
  for (const char* key : {"background", "conversation"})
    if (j.contains(key) && !j[key].is_null() && j[key] != false)
      return invalid_request(key, fmt::format("{} is not served: a session's responses are answered in order, in the "
                                              "request", key));
  if (j.contains("instructions") && !j["instructions"].is_null()) {
    if (!j["instructions"].is_string()) return invalid_request("instructions", "instructions must be a string");
    chat.messages.push_back({"system", j["instructions"].get<std::string>(), {}});
    out->has_instructions = true;
  }
  if (!j.contains("input") || j["input"].is_null()) return invalid_request("input", "input (a string or a list of items) is required");
  const ojson& input = j["input"];
  if (input.is_string()) {
    chat.messages.push_back({"user", input.get<std::string>(), {}});
  } else if (input.is_array() && !input.empty()) {
    for (size_t i = 0; i < input.size(); ++i)
      if (auto e = read_item(input[i], fmt::format("input[{}]", i), &chat.messages)) return e;
  } else {
    return invalid_request("input", "input must be a string or a non-empty list of items");
  }
  if (j.contains("previous_response_id") && !j["previous_response_id"].is_null()) {
    if (!j["previous_response_id"].is_string())
      return invalid_request("previous_response_id", "previous_response_id must be a string");
    out->previous_response_id = j["previous_response_id"].get<std::string>();
  }
  if (j.contains("tools") && !j["tools"].is_null()) {
    if (!j["tools"].is_array()) return invalid_request("tools", "tools must be a list");
    for (size_t k = 0; k < j["tools"].size(); ++k) {
      const ojson& t = j["tools"][k];
      if (string_field(t, "type") != "function" || !t.contains("name") || !t["name"].is_string())
        return invalid_request(fmt::format("tools[{}]", k), "a tool must be {\"type\": \"function\", \"name\": ...} "
                                                            "(function tools only: built-in tools are not served)");
      ojson function = {{"name", t["name"]}};
      if (t.contains("description") && !t["description"].is_null()) function["description"] = t["description"];
      function["parameters"] = t.contains("parameters") && !t["parameters"].is_null() ? t["parameters"] : ojson::object();
      chat.tools.push_back(python_json_dumps(ojson{{"type", "function"}, {"function", function}}));
    }
  }
  if (auto e = check_boolean(j, "stream")) return e;
  chat.stream = bool_field(j, "stream");
  if (auto e = check_number_field(j, "temperature", 0, 2)) return e;
  if (auto e = check_number_field(j, "top_p", 0, 1)) return e;
  if (auto e = check_number_field(j, "max_output_tokens", 1, 1e12)) return e;
  if (auto e = check_top_logprobs(j)) return e;
  if (j.contains("include") && !j["include"].is_null()) {
    if (!j["include"].is_array()) return invalid_request("include", "include must be a list of strings");
    for (const ojson& x : j["include"]) {
      if (!x.is_string()) return invalid_request("include", "include must be a list of strings");
      if (x == "message.output_text.logprobs") chat.logprobs = true;
    }
  }
  return std::nullopt;
}

std::string response_json(const AssistantTurn& turn, const std::string& id, const std::string& model, int64_t created,
                          bool with_logprobs) {
  return json_text(response_object(turn, id, model, created, output_items(turn, id, with_logprobs),
                                   incomplete(turn) ? "incomplete" : "completed"));
}

std::string response_events(const AssistantTurn& turn, const std::string& id, const std::string& model,
                            int64_t created, bool with_logprobs) {
  std::string out;
  int64_t seq = 0;
  auto event = [&](const char* type, ojson data) {
    ojson e = {{"type", type}, {"sequence_number", seq++}};
    for (auto& [k, v] : data.items()) e[k] = v;
    out += fmt::format("event: {}\ndata: {}\n\n", type, json_text(e));
  };
  event("response.created", {{"response", response_object(turn, id, model, created, ojson::array(), "in_progress")}});
  event("response.in_progress", {{"response", response_object(turn, id, model, created, ojson::array(), "in_progress")}});
  const ojson items = output_items(turn, id, with_logprobs);
  for (size_t i = 0; i < items.size(); ++i) {
    const ojson& item = items[i];
    const std::string type = item["type"].get<std::string>();
    ojson opened = item;
    if (type == "message") opened["content"] = ojson::array(), opened["status"] = "in_progress";
    if (type == "reasoning") opened["content"] = ojson::array();
    if (type == "function_call") opened["arguments"] = "", opened["status"] = "in_progress";
    event("response.output_item.added", {{"output_index", i}, {"item", opened}});
    const ojson at = {{"item_id", item["id"]}, {"output_index", i}};
    auto with = [&at](ojson more) {
      for (auto& [k, v] : at.items()) more[k] = v;
      return more;
    };
    if (type == "message") {
      const ojson& part = item["content"][0];
      ojson empty = part;
      empty["text"] = "";
      if (with_logprobs) empty["logprobs"] = ojson::array();
      event("response.content_part.added", with({{"content_index", 0}, {"part", empty}}));
      const ojson logprobs = with_logprobs ? part["logprobs"] : ojson::array();
      event("response.output_text.delta", with({{"content_index", 0}, {"delta", part["text"]}, {"logprobs", logprobs}}));
      event("response.output_text.done", with({{"content_index", 0}, {"text", part["text"]}, {"logprobs", logprobs}}));
      event("response.content_part.done", with({{"content_index", 0}, {"part", part}}));
    } else if (type == "reasoning") {
      const ojson& text = item["content"][0]["text"];
      event("response.reasoning_text.delta", with({{"content_index", 0}, {"delta", text}}));
      event("response.reasoning_text.done", with({{"content_index", 0}, {"text", text}}));
    } else {
      event("response.function_call_arguments.delta", with({{"delta", item["arguments"]}}));
      event("response.function_call_arguments.done", with({{"name", item["name"]}, {"arguments", item["arguments"]}}));
    }
    event("response.output_item.done", {{"output_index", i}, {"item", item}});
  }
  const char* status = incomplete(turn) ? "incomplete" : "completed";
  event(incomplete(turn) ? "response.incomplete" : "response.completed",
        {{"response", response_object(turn, id, model, created, items, status)}});
  return out;
}

}  // namespace slimpi
