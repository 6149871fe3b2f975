#include "agent/openai_chat.h"

#include <slimpi/error.h>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "tokenizer/tool_calls.h"

namespace slimpi {
namespace {

using ojson = nlohmann::ordered_json;

const char* json_type(const ojson& v) { return v.type_name(); }

// A message's content: a string, null, or a list of {"type": "text", "text": ...} parts.
std::optional<ApiError> read_content(const ojson& m, const std::string& where, std::string* out) {
  out->clear();
  if (!m.contains("content") || m["content"].is_null()) return std::nullopt;
  const ojson& c = m["content"];
  if (c.is_string()) {
    *out = c.get<std::string>();
    return std::nullopt;
  }
  if (!c.is_array()) return invalid_request(where + ".content", fmt::format("content must be a string or a list of text parts, not {}", json_type(c)));
  for (size_t k = 0; k < c.size(); ++k) {
    const ojson& part = c[k];
    const std::string at = fmt::format("{}.content[{}]", where, k);
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      return invalid_request(at, "a content part must be an object with a string \"type\"");
    if (part["type"] != "text" || !part.contains("text") || !part["text"].is_string())
      return invalid_request(at, fmt::format("content parts of type \"{}\" are not served (text only: this is a text model)",
                                 part["type"].get<std::string>()));
    *out += part["text"].get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> read_tool_calls(const ojson& m, const std::string& where, std::vector<AgentToolCall>* out) {
  if (!m.contains("tool_calls") || m["tool_calls"].is_null()) return std::nullopt;
  const ojson& calls = m["tool_calls"];
  if (!calls.is_array()) return invalid_request(where + ".tool_calls", "tool_calls must be a list");
  for (size_t k = 0; k < calls.size(); ++k) {
    const ojson& c = calls[k];
    const std::string at = fmt::format("{}.tool_calls[{}]", where, k);
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
      return invalid_request(at, "a tool call must be an object with a \"function\" object");
    const ojson& f = c["function"];
    if (!f.contains("name") || !f["name"].is_string()) return invalid_request(at + ".function.name", "a tool call needs a string name");
    AgentToolCall call;
    call.name = f["name"].get<std::string>();
    if (c.contains("id") && c["id"].is_string()) call.id = c["id"].get<std::string>();
    if (f.contains("arguments") && f["arguments"].is_string())
      call.arguments_json = canonical_arguments(f["arguments"].get<std::string>());
    else if (f.contains("arguments") && f["arguments"].is_object())
      call.arguments_json = python_json_dumps(f["arguments"]);
    else if (!f.contains("arguments") || f["arguments"].is_null())
      call.arguments_json = "{}";
    else
      return invalid_request(at + ".function.arguments", "arguments must be a JSON object's text");
    out->push_back(std::move(call));
  }
  return std::nullopt;
}

std::optional<ApiError> check_type(const ojson& j, const char* key, bool (ojson::*is)() const noexcept,
                                   const char* what) {
  if (!j.contains(key) || j[key].is_null() || (j[key].*is)()) return std::nullopt;
  return invalid_request(key, fmt::format("{} must be {}, not {}", key, what, json_type(j[key])));
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

ojson tool_calls_json(const std::vector<AgentToolCall>& calls, bool with_index) {
  ojson out = ojson::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    ojson c;
    if (with_index) c["index"] = k;
    c["id"] = calls[k].id;
    c["type"] = "function";
    c["function"] = {{"name", calls[k].name}, {"arguments", calls[k].arguments_json}};
    out.push_back(std::move(c));
  }
  return out;
}

ojson usage_json(const AssistantTurn& t) {
  return {{"prompt_tokens", t.prompt_tokens},
          {"completion_tokens", t.completion_tokens},
          {"total_tokens", t.prompt_tokens + t.completion_tokens}};
}

// Text as a client receives it: invalid UTF-8 (a turn may end inside a character, a small
// model writes any bytes) replaced by U+FFFD, as the JSON it is sent in has it.
std::string as_received(const std::string& text) { return ojson::parse(json_text(ojson(text))).get<std::string>(); }

// choices[0].logprobs: {"content": [...], "refusal": null}, or null when not asked for.
ojson logprobs_json(const AssistantTurn& t, bool with_logprobs);

// The "# Tools" block of Qwen2.5's and Qwen3's chat templates.
std::string qwen_tools_block(const std::vector<std::string>& tools) {
  std::string s =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
      "signatures within <tools></tools> XML tags:\n<tools>";
  for (const std::string& t : tools) s += "\n" + t;
  return s + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
             "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
             "<args-json-object>}\n</tool_call>";
}

bool writes_qwen_tools(ChatTemplate t) {
  return t == ChatTemplate::ChatML || t == ChatTemplate::Qwen3 || t == ChatTemplate::None;
}

}  // namespace

ApiError api_error(int status, std::string type, std::string code, std::string message, std::string param) {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.code = std::move(code);
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

ApiError invalid_request(std::string param, std::string message) {
  return api_error(400, "invalid_request_error", "", std::move(message), std::move(param));
}

std::string json_text(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

std::string string_field(const ojson& o, const char* key) {
  return o.is_object() && o.contains(key) && o[key].is_string() ? o[key].get<std::string>() : std::string();
}

bool bool_field(const ojson& o, const char* key) {
  return o.is_object() && o.contains(key) && o[key].is_boolean() && o[key].get<bool>();
}

std::string canonical_arguments(const std::string& text) {
  const ojson v = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  return v.is_discarded() ? text : python_json_dumps(v);
}

std::optional<ApiError> check_top_logprobs(const ojson& j) {
  if (!j.contains("top_logprobs") || j["top_logprobs"].is_null()) return std::nullopt;
  if (!j["top_logprobs"].is_number_integer() || j["top_logprobs"].get<int64_t>() < 0 || j["top_logprobs"].get<int64_t>() > 20)
    return invalid_request("top_logprobs", "top_logprobs must be an integer in [0, 20]");
  if (j["top_logprobs"].get<int64_t>() > 0)
    return invalid_request("top_logprobs", "top_logprobs > 0 is not served: the rollout engine records the log-probability "
                                           "of the sampled token alone (logprobs gives it)");
  return std::nullopt;
}

ojson token_logprob_json(const TokenLogprob& t) {
  ojson bytes = ojson::array();
  for (unsigned char c : t.bytes) bytes.push_back(int(c));
  return {{"token", as_received(t.bytes)}, {"logprob", t.logprob}, {"bytes", bytes}, {"top_logprobs", ojson::array()}};
}

std::optional<ApiError> check_number_field(const ojson& j, const char* key, double lo, double hi) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_number()) return invalid_request(key, fmt::format("{} must be a number, not {}", key, json_type(j[key])));
  const double v = j[key].get<double>();
  if (v < lo || v > hi) return invalid_request(key, fmt::format("{} = {} is outside [{}, {}]", key, v, lo, hi));
  return std::nullopt;
}

std::string python_json_dumps(const ojson& v) {
  if (v.is_object()) {
    std::string s = "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      s += (first ? "" : ", ") + json_text(ojson(it.key())) + ": " + python_json_dumps(it.value());
      first = false;
    }
    return s + "}";
  }
  if (v.is_array()) {
    std::string s = "[";
    for (size_t k = 0; k < v.size(); ++k) s += (k ? ", " : "") + python_json_dumps(v[k]);
    return s + "]";
  }
  return json_text(v);
}

std::string openai_error_body(const ApiError& e) {
  ojson err = {{"message", e.message},
               {"type", e.type},
               {"param", e.param.empty() ? ojson() : ojson(e.param)},
               {"code", e.code.empty() ? ojson() : ojson(e.code)}};
  return json_text(ojson{{"error", err}});
}

bool AgentMessage::same_as(const AgentMessage& o) const {
  if (role != o.role || content != o.content || tool_calls.size() != o.tool_calls.size()) return false;
  for (size_t k = 0; k < tool_calls.size(); ++k) {
    if (tool_calls[k].name != o.tool_calls[k].name) return false;
    const nlohmann::json a = nlohmann::json::parse(tool_calls[k].arguments_json, nullptr, false);
    const nlohmann::json b = nlohmann::json::parse(o.tool_calls[k].arguments_json, nullptr, false);
    if (a.is_discarded() || b.is_discarded() ? tool_calls[k].arguments_json != o.tool_calls[k].arguments_json : a != b)
      return false;
  }
  return true;
}

std::optional<ApiError> parse_chat_completion(const std::string& body, ChatCompletionRequest* out) {
  *out = ChatCompletionRequest();
  ojson j = ojson::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_request("", "the request body is not valid JSON");
  if (!j.is_object()) return invalid_request("", fmt::format("the request body must be a JSON object, not {}", json_type(j)));
  if (!j.contains("model") || !j["model"].is_string()) return invalid_request("model", "model (a string) is required");
  out->model = j["model"].get<std::string>();
  if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty())
    return invalid_request("messages", "messages must be a non-empty list");
  const ojson& ms = j["messages"];
  for (size_t i = 0; i < ms.size(); ++i) {
    const std::string where = fmt::format("messages[{}]", i);
    const ojson& m = ms[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return invalid_request(where, "a message must be an object with a string \"role\"");
    AgentMessage msg;
    msg.role = m["role"].get<std::string>();
    if (msg.role == "developer") msg.role = "system";
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
      return invalid_request(where + ".role", fmt::format("role \"{}\" is not served (system, developer, user, assistant, tool)",
                                              msg.role));
    if (auto e = read_content(m, where, &msg.content)) return e;
    if (msg.role == "assistant") {
      if (auto e = read_tool_calls(m, where, &msg.tool_calls)) return e;
    } else if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      return invalid_request(where + ".tool_calls", "only assistant messages carry tool_calls");
    }
    out->messages.push_back(std::move(msg));
  }
  if (j.contains("tools") && !j["tools"].is_null()) {
    if (!j["tools"].is_array()) return invalid_request("tools", "tools must be a list");
    for (size_t k = 0; k < j["tools"].size(); ++k) {
      const ojson& t = j["tools"][k];
      if (!t.is_object() || string_field(t, "type") != "function" || !t.contains("function") ||
          !t["function"].is_object() || !t["function"].contains("name") || !t["function"]["name"].is_string())
        return invalid_request(fmt::format("tools[{}]", k), "a tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
      out->tools.push_back(python_json_dumps(t));
    }
  }
  if (auto e = check_type(j, "stream", &ojson::is_boolean, "a boolean")) return e;
  out->stream = bool_field(j, "stream");
  if (j.contains("stream_options")) out->include_usage = bool_field(j["stream_options"], "include_usage");
  if (auto e = check_number_field(j, "temperature", 0, 2)) return e;
  if (auto e = check_number_field(j, "top_p", 0, 1)) return e;
  if (auto e = check_number_field(j, "max_tokens", 1, 1e12)) return e;
  if (auto e = check_number_field(j, "max_completion_tokens", 1, 1e12)) return e;
  if (auto e = check_type(j, "seed", &ojson::is_number_integer, "an integer")) return e;
  if (auto e = check_type(j, "logprobs", &ojson::is_boolean, "a boolean")) return e;
  out->logprobs = bool_field(j, "logprobs");
  if (auto e = check_top_logprobs(j)) return e;
  if (j.contains("n") && !j["n"].is_null() && j["n"] != 1)
    return invalid_request("n", "n must be 1: an episode's turn is one sample (fan-out is the group's n_samples_per_prompt)");
  if (j.contains("stop") && !j["stop"].is_null()) {
    const ojson& s = j["stop"];
    bool ok = s.is_string() || s.is_array();
    if (s.is_array())
      for (const ojson& x : s) ok = ok && x.is_string();
    if (!ok) return invalid_request("stop", "stop must be a string or a list of strings");
  }
  return std::nullopt;
}

AssistantTurn assistant_turn(const ModelTurn& action, ChatTemplate t) {
  AssistantTurn turn;
  std::string text = action.text;
  bool cut = false;  // reasoning or tool calls taken out of the text: what is left is trimmed
  if (chat_template_spec(t).reads_reasoning) {
    const size_t end = text.find("</think>");
    if (end != std::string::npos) {
      std::string r = text.substr(0, end);
      if (r.rfind("<think>", 0) == 0) r = r.substr(7);
      turn.reasoning = as_received(trim(r));
      text = text.substr(end + 8);
      cut = true;
    }
  }
  int k = 0;
  for (const ToolCall& c : action.tool_calls) {
    if (!c.error.empty()) continue;  // a malformed call stays in the content as written
    const size_t at = text.find(c.raw);
    if (at != std::string::npos) text.erase(at, c.raw.size());
    cut = true;
    turn.tool_calls.push_back({fmt::format("call_{}_{}", action.turn, k++), c.name, canonical_arguments(c.arguments_json)});
  }
  turn.content = as_received(cut ? trim(text) : text);
  turn.finish_reason = turn.tool_calls.empty() ? action.finish_reason : "tool_calls";
  turn.prompt_tokens = action.context_tokens;
  turn.completion_tokens = action.new_tokens;
  if (action.token_texts != nullptr && action.log_probs != nullptr) {
    SLIMPI_CHECK(action.token_texts->size() == action.log_probs->size(), "agent: a turn of {} tokens with {} log-probs",
                 action.token_texts->size(), action.log_probs->size());
    for (size_t k = 0; k < action.token_texts->size(); ++k)
      turn.logprobs.push_back({(*action.token_texts)[k], (*action.log_probs)[k]});
  }
  return turn;
}

namespace {

ojson logprobs_json(const AssistantTurn& t, bool with_logprobs) {
  if (!with_logprobs) return nullptr;
  ojson content = ojson::array();
  for (const TokenLogprob& x : t.logprobs) content.push_back(token_logprob_json(x));
  return {{"content", content}, {"refusal", nullptr}};
}

}  // namespace

AgentMessage as_message(const AssistantTurn& turn) {
  AgentMessage m;
  m.role = "assistant";
  m.content = turn.content;
  m.tool_calls = turn.tool_calls;
  return m;
}

std::string chat_completion_json(const AssistantTurn& turn, const std::string& id, const std::string& model,
                                 int64_t created, bool with_logprobs) {
  ojson message = {{"role", "assistant"},
                   {"content", turn.content.empty() && !turn.tool_calls.empty() ? ojson() : ojson(turn.content)}};
  if (!turn.reasoning.empty()) message["reasoning_content"] = turn.reasoning;
  if (!turn.tool_calls.empty()) message["tool_calls"] = tool_calls_json(turn.tool_calls, false);
  ojson choice = {{"index", 0}, {"message", message}, {"logprobs", logprobs_json(turn, with_logprobs)},
                 {"finish_reason", turn.finish_reason}};
  return json_text(ojson{{"id", id},
                    {"object", "chat.completion"},
                    {"created", created},
                    {"model", model},
                    {"choices", ojson::array({choice})},
                    {"usage", usage_json(turn)}});
}

std::string chat_completion_events(const AssistantTurn& turn, const std::string& id, const std::string& model,
                                   int64_t created, bool include_usage, bool with_logprobs) {
  std::string out;
  auto chunk = [&](ojson delta, const ojson& finish, const ojson& logprobs = nullptr) {
    ojson choice = {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", logprobs}, {"finish_reason", finish}};
    ojson c = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
               {"choices", ojson::array({choice})}};
    out += "data: " + json_text(c) + "\n\n";
  };
  chunk({{"role", "assistant"}, {"content", ""}}, nullptr);
  if (!turn.reasoning.empty()) chunk({{"reasoning_content", turn.reasoning}}, nullptr);
  if (!turn.content.empty()) chunk({{"content", turn.content}}, nullptr);
  if (!turn.tool_calls.empty()) chunk({{"tool_calls", tool_calls_json(turn.tool_calls, true)}}, nullptr);
  chunk(ojson::object(), turn.finish_reason, logprobs_json(turn, with_logprobs));  // every token's, in one chunk
  if (include_usage) {
    ojson c = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
               {"choices", ojson::array()}, {"usage", usage_json(turn)}};
    out += "data: " + json_text(c) + "\n\n";
  }
  return out + "data: [DONE]\n\n";
}

std::string conversation_messages(const std::vector<AgentMessage>& messages, const std::vector<std::string>& tools,
                                  const ChatFormat& format, std::vector<ChatMessage>* out) {
  out->clear();
  const ChatTemplate t = format.chat_template;
  if (!tools.empty() && !writes_qwen_tools(t))
    return fmt::format("tools are written into the prompt for the chatml, qwen3 and none chat templates; this job's "
                       "is {} (describe the tools in the system message instead)", chat_template_name(t));
  nlohmann::json list = nlohmann::json::array();
  for (const AgentMessage& m : messages) {
    std::string content = m.content;
    if (!m.tool_calls.empty()) {
      if (!writes_qwen_tools(t))
        return fmt::format("an assistant message with tool_calls is rendered for the chatml, qwen3 and none chat "
                           "templates; this job's is {}", chat_template_name(t));
      for (const AgentToolCall& call : m.tool_calls)
        content += fmt::format("{}<tool_call>\n{{\"name\": {}, \"arguments\": {}}}\n</tool_call>",
                               content.empty() ? "" : "\n", python_json_dumps(ojson(call.name)), call.arguments_json);
    }
    list.push_back({{"role", m.role}, {"content", content}});
  }
  if (!tools.empty()) {
    const std::string block = qwen_tools_block(tools);
    if (!list.empty() && list[0]["role"] == "system") {
      list[0]["content"] = list[0]["content"].get<std::string>() + "\n\n" + block;
    } else {
      const std::string& sys = format.system_prompt;
      list.insert(list.begin(), nlohmann::json{{"role", "system"}, {"content", sys.empty() ? block : sys + "\n\n" + block}});
    }
  }
  // The template's own rules (the roles it renders; Qwen3.5's system-first and user-query rules).
  return parse_chat_messages(list, t, out);
}

}  // namespace slimpi
