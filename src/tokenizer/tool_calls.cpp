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
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
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
    nlohmann::ordered_json args = j[key];
    if (args.is_string()) {  // some models write the arguments as a JSON string
      args = nlohmann::ordered_json::parse(args.get<std::string>(), nullptr, false);
      if (args.is_discarded()) {
        call.error = std::string("\"") + key + "\" is a string that is not JSON";
        return call;
      }
    }
    if (!args.is_object()) {
      call.error = std::string("\"") + key + "\" is not an object";
      return call;
    }
    call.arguments_json = args.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    break;
  }
  return call;
}

// An argument value written as text: the JSON value it parses as, else the string as written
// (GLM's and Qwen3.5's templates write strings raw and other values as JSON).
nlohmann::ordered_json json_or_string(const std::string& value) {
  const nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(value, nullptr, /*allow_exceptions=*/false);
  return parsed.is_discarded() ? nlohmann::ordered_json(value) : parsed;
}

// One GLM-4.5 call's body (between <tool_call> and </tool_call>):
//   NAME [\n] (<arg_key>K</arg_key> [\n] <arg_value>V</arg_value> [\n])*
// A value that parses as JSON is that JSON value, any other is the string as written
// (the template writes strings raw and other values as JSON, as SGLang's glm45 parser reads them).
ToolCall from_glm_body(const std::string& body, const std::string& raw) {
  ToolCall call;
  call.raw = raw;
  const auto trim = [](const std::string& x) {
    const size_t b = x.find_first_not_of(" \t\r\n"), e = x.find_last_not_of(" \t\r\n");
    return b == std::string::npos ? std::string() : x.substr(b, e - b + 1);
  };
  const size_t first_key = body.find("<arg_key>");
  const std::string name = trim(body.substr(0, first_key));
  if (name.empty() || name.find_first_of(" \t\r\n<>") != std::string::npos) {
    call.error = "no function name before the arguments";
    return call;
  }
  nlohmann::ordered_json args = nlohmann::ordered_json::object();
  for (size_t at = first_key; at != std::string::npos; at = body.find("<arg_key>", at)) {
    const size_t key_end = body.find("</arg_key>", at);
    const size_t value_at = key_end == std::string::npos ? key_end : body.find("<arg_value>", key_end);
    const size_t value_end = value_at == std::string::npos ? value_at : body.find("</arg_value>", value_at);
    if (value_end == std::string::npos) {
      call.error = "an <arg_key> without its </arg_key> <arg_value>...</arg_value>";
      return call;
    }
    const std::string key = body.substr(at + 9, key_end - at - 9);
    if (!trim(body.substr(key_end + 10, value_at - key_end - 10)).empty()) {
      call.error = "text between </arg_key> and <arg_value> of '" + key + "'";
      return call;
    }
    if (args.contains(key)) {
      call.error = "argument '" + key + "' given twice";
      return call;
    }
    args[key] = json_or_string(body.substr(value_at + 11, value_end - value_at - 11));
    at = value_end + 12;
  }
  call.name = name;
  call.arguments_json = args.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return call;
}

// Qwen3.5's calls (Qwen3-Coder's XML form, as SGLang's and vLLM's qwen3_coder parsers read it):
//   <tool_call>\n<function=NAME>\n(<parameter=KEY>\nVALUE\n</parameter>\n)*</function>\n</tool_call>
// A value loses one leading and one trailing newline; one that parses as JSON is that JSON
// value, any other the string as written (the parsers convert by the tool's schema, which
// slimpi does not have: a string-typed argument that looks like a number arrives as one).
ToolCall from_qwen_xml_body(const std::string& body, const std::string& raw) {
  ToolCall call;
  call.raw = raw;
  const size_t fn = body.find("<function=");
  const size_t name_end = fn == std::string::npos ? fn : body.find('>', fn);
  const size_t fn_end = name_end == std::string::npos ? name_end : body.find("</function>", name_end);
  if (fn_end == std::string::npos) {
    call.error = "not <function=NAME>...</function>";
    return call;
  }
  const std::string name = body.substr(fn + 10, name_end - fn - 10);
  if (name.empty() || name.find_first_of(" \t\r\n<") != std::string::npos) {
    call.error = "no function name in <function=...>";
    return call;
  }
  nlohmann::ordered_json args = nlohmann::ordered_json::object();
  const std::string params = body.substr(name_end + 1, fn_end - name_end - 1);
  for (size_t at = params.find("<parameter="); at != std::string::npos; at = params.find("<parameter=", at)) {
    const size_t key_end = params.find('>', at);
    const size_t value_end = key_end == std::string::npos ? key_end : params.find("</parameter>", key_end);
    if (value_end == std::string::npos) {
      call.error = "a <parameter=...> without its closing </parameter>";
      return call;
    }
    const std::string key = params.substr(at + 11, key_end - at - 11);
    if (args.contains(key)) {
      call.error = "argument '" + key + "' given twice";
      return call;
    }
    std::string value = params.substr(key_end + 1, value_end - key_end - 1);
    if (!value.empty() && value.front() == '\n') value.erase(0, 1);
    if (!value.empty() && value.back() == '\n') value.pop_back();
    args[key] = json_or_string(value);
    at = value_end + 12;
  }
  call.name = name;
  call.arguments_json = args.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return call;
}

// <tool_call> ... </tool_call> blocks, each body parsed by `body_call`.
std::vector<ToolCall> parse_blocks(const std::string& text, ToolCall (*body_call)(const std::string&, const std::string&)) {
  std::vector<ToolCall> calls;
  for (size_t at = text.find(kOpen); at != std::string::npos; at = text.find(kOpen, at)) {
    const size_t body = at + std::string(kOpen).size();
    const size_t end = text.find(kClose, body);
    if (end == std::string::npos) {  // an unclosed call (the turn ran out of tokens)
      calls.push_back({"", "", text.substr(at), "no closing </tool_call>"});
      break;
    }
    calls.push_back(body_call(text.substr(body, end - body), text.substr(at, end + std::string(kClose).size() - at)));
    at = end + std::string(kClose).size();
  }
  return calls;
}

// DeepSeek-V3 / R1 calls: <｜tool▁call▁begin｜>TYPE<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>,
// inside <｜tool▁calls▁begin｜> ... <｜tool▁calls▁end｜>.
constexpr const char* kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr const char* kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr const char* kDsSep = "<｜tool▁sep｜>";
constexpr const char* kDsCallsEnd = "<｜tool▁calls▁end｜>";

std::vector<ToolCall> parse_deepseek_calls(const std::string& text) {
  std::vector<ToolCall> calls;
  const std::string begin_marker = kDsCallBegin, end_marker = kDsCallEnd, sep = kDsSep;
  for (size_t at = text.find(begin_marker); at != std::string::npos; at = text.find(begin_marker, at)) {
    const size_t end = text.find(end_marker, at);
    ToolCall call;
    call.raw = text.substr(at, end == std::string::npos ? std::string::npos : end + end_marker.size() - at);
    if (end == std::string::npos) {
      call.error = std::string("no closing ") + kDsCallEnd;
      calls.push_back(call);
      break;
    }
    const std::string body = text.substr(at + begin_marker.size(), end - at - begin_marker.size());
    at = end + end_marker.size();
    const size_t s = body.find(sep);
    const size_t name_end = s == std::string::npos ? s : body.find('\n', s);
    const size_t open = name_end == std::string::npos ? name_end : body.find("```json", name_end);
    const size_t close = open == std::string::npos ? open : body.rfind("```");
    if (close == std::string::npos || close <= open) {
      call.error = std::string("not TYPE") + kDsSep + "NAME\n```json\n{...}\n```";
      calls.push_back(call);
      continue;
    }
    const std::string name = body.substr(s + sep.size(), name_end - s - sep.size());
    const nlohmann::ordered_json args = nlohmann::ordered_json::parse(body.substr(open + 7, close - open - 7), nullptr, false);
    if (name.empty()) call.error = "no function name";
    else if (args.is_discarded()) call.error = "arguments are not valid JSON";
    else if (!args.is_object()) call.error = "arguments are not a JSON object";
    if (call.error.empty()) {
      call.name = name;
      call.arguments_json = args.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    }
    calls.push_back(call);
  }
  return calls;
}

}  // namespace

std::vector<ToolCall> parse_tool_calls(const std::string& text, ChatTemplate t) {
  if (t == ChatTemplate::Glm45 || t == ChatTemplate::Glm47) return parse_blocks(text, from_glm_body);
  if (t == ChatTemplate::Qwen3_5) return parse_blocks(text, from_qwen_xml_body);
  if (t == ChatTemplate::DeepSeekR1 || t == ChatTemplate::DeepSeekV3) return parse_deepseek_calls(text);
  if (t == ChatTemplate::Llama3) {
    std::vector<ToolCall> calls;
    const size_t first = text.find_first_not_of(" \t\r\n");
    if (first != std::string::npos && text[first] == '{') calls.push_back(from_json_text(text, text, {"parameters", "arguments"}));
    return calls;
  }
  return parse_blocks(text, [](const std::string& body, const std::string& raw) {
    return from_json_text(body, raw, {"arguments"});
  });
}

std::string tool_call_stop(ChatTemplate t) {
  if (t == ChatTemplate::Llama3) return "";
  return t == ChatTemplate::DeepSeekR1 || t == ChatTemplate::DeepSeekV3 ? kDsCallsEnd : kClose;
}

}  // namespace slimpi
