#include "tokenizer/tool_calls.h"

#include <nlohmann/json.hpp>

namespace slimpi {
namespace {

constexpr const char* kOpen = "<tool_call>";
constexpr const char* kClose = "</tool_call>";

// {"name": ..., args_key: {...}} -> the call (or why not).
ToolCall from_json_text(const std::string& body, const std::string& raw, std::initializer_list<const char*> args_keys) {
  ToolCall call;
  call.raw = raw;
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    call.error = "not valid JSON";
    return call;
  }
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) {
    call.error = "not an object with a string \"name\"";
    return call;
  }
  call.name = j["name"].get<std::string>();
  call.arguments_json = "{}";
  for (const char* key : args_keys) {
    if (!j.contains(key)) continue;
    nlohmann::json args = j[key];
    if (args.is_string()) {  // some models write the arguments as a JSON string
      args = nlohmann::json::parse(args.get<std::string>(), nullptr, false);
      if (args.is_discarded()) {
        call.error = std::string("\"") + key + "\" is a string that is not JSON";
        return call;
      }
    }
    if (!args.is_object()) {
      call.error = std::string("\"") + key + "\" is not an object";
      return call;
    }
    call.arguments_json = args.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    break;
  }
  return call;
}

}  // namespace

std::vector<ToolCall> parse_tool_calls(const std::string& text, ChatTemplate t) {
  std::vector<ToolCall> calls;
  if (t == ChatTemplate::Llama3) {
    const size_t first = text.find_first_not_of(" \t\r\n");
    if (first != std::string::npos && text[first] == '{') calls.push_back(from_json_text(text, text, {"parameters", "arguments"}));
    return calls;
  }
  for (size_t at = text.find(kOpen); at != std::string::npos; at = text.find(kOpen, at)) {
    const size_t body = at + std::string(kOpen).size();
    const size_t end = text.find(kClose, body);
    if (end == std::string::npos) {  // an unclosed call (the turn ran out of tokens)
      ToolCall call;
      call.raw = text.substr(at);
      call.error = "no closing </tool_call>";
      calls.push_back(call);
      break;
    }
    calls.push_back(from_json_text(text.substr(body, end - body), text.substr(at, end + std::string(kClose).size() - at),
                                   {"arguments"}));
    at = end + std::string(kClose).size();
  }
  return calls;
}

std::string tool_call_stop(ChatTemplate t) { return t == ChatTemplate::Llama3 ? "" : kClose; }

}  // namespace slimpi
