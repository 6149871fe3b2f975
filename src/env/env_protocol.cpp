#include "env/env_protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <regex>
#include <nlohmann/json.hpp>

namespace slimpi {
namespace {

using nlohmann::json;

// Model text is raw bytes: invalid UTF-8 is replaced (U+FFFD) on the wire, never fatal.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

bool finite_number(const json& v) { return v.is_number() && std::isfinite(v.get<double>()); }

// A metric's name becomes a metrics.h5 column (rollout/env_metrics/<name>): at most 64 of
// letters, digits, '_', '-', '.'; any other character becomes '_' ("" becomes "_").
std::string metric_name(const std::string& name) {
  std::string out = name.substr(0, 64);
  for (char& c : out)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) c = '_';
  return out.empty() ? "_" : out;
}

// The fields of an observation reply; "" or what is wrong.
std::string read_observation(const json& j, int64_t vocab_size, EnvReply* r) {
  for (const auto& [key, v] : j.items()) {
    if (key == "type" || key == "episode") continue;
    if (key == "messages") {
      if (!v.is_array()) return "\"messages\" is not a list";
      for (const json& m : v) {
        if (!m.is_object() || !m.contains("role") || !m.contains("content") || !m["role"].is_string() ||
            !m["content"].is_string())
          return "a message is not {\"role\": string, \"content\": string}";
        const std::string role = m["role"].get<std::string>();
        if (role != "user" && role != "tool" && role != "system")
          return fmt::format("message role \"{}\" (an observation's roles: user, tool, system)", role);
        r->messages.push_back({role, m["content"].get<std::string>(), false, ""});
      }
    } else if (key == "token_ids") {
      if (!v.is_array()) return "\"token_ids\" is not a list";
      for (const json& t : v) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab_size)
          return fmt::format("token id {} is not in the vocabulary [0, {})", dump(t), vocab_size);
        r->token_ids.push_back(t.get<int64_t>());
      }
    } else if (key == "reward") {
      if (finite_number(v)) {
        r->reward = v.get<double>();
        if (std::abs(r->reward) > kMaxAbsReward) return fmt::format("\"reward\" {} is beyond ±{:g}", dump(v), kMaxAbsReward);
      } else if (v.is_object()) {
        r->reward = 0;
        for (const auto& [part, x] : v.items()) {
          if (!finite_number(x)) return fmt::format("reward part \"{}\" is {}, not a finite number", part, dump(x));
          r->reward_parts[part] = x.get<double>();
          r->reward += x.get<double>();
        }
        if (!(std::abs(r->reward) <= kMaxAbsReward))
          return fmt::format("the reward's parts sum to {:g}, beyond ±{:g}", r->reward, kMaxAbsReward);
      } else {
        return fmt::format("\"reward\" is {}, not a finite number or an object of them", dump(v));
      }
    } else if (key == "done" || key == "truncated" || key == "new_context") {
      if (!v.is_boolean()) return fmt::format("\"{}\" is not true or false", key);
      (key == "done" ? r->done : key == "truncated" ? r->truncated : r->new_context) = v.get<bool>();
    } else if (key == "resume_context") {
      if (!v.is_number_integer() || v.get<int64_t>() < 0)
        return fmt::format("\"resume_context\" is {}, not a context's number (0, 1, ...)", dump(v));
      r->resume_context = v.get<int64_t>();
    } else if (key == "error") {
      if (v.is_null()) continue;
      if (!v.is_object() || !v.contains("class") || !v["class"].is_string())
        return "\"error\" is not {\"class\": string, \"message\": string}";
      if (!parse_env_error(v["class"].get<std::string>(), &r->error) || r->error == EnvError::None)
        return fmt::format("error class \"{}\" (one of model, tool, infra, overlong)", v["class"].get<std::string>());
      if (v.contains("message")) r->message = v["message"].is_string() ? v["message"].get<std::string>() : dump(v["message"]);
    } else if (key == "snapshot") {
      if (v.is_null()) return "\"snapshot\" is null (the episode's state: any other JSON value)";
      r->snapshot = dump(v);
    } else if (key == "metrics") {
      if (!v.is_object()) return "\"metrics\" is not an object";
      for (const auto& [name, x] : v.items()) {
        if (!finite_number(x)) return fmt::format("metric \"{}\" is {}, not a finite number", name, dump(x));
        if (std::abs(x.get<double>()) > kMaxAbsMetric)
          return fmt::format("metric \"{}\" {} is beyond ±{:g}", name, dump(x), kMaxAbsMetric);
        r->metrics[metric_name(name)] += x.get<double>();
      }
    } else {
      return fmt::format("unknown key \"{}\"", key);
    }
  }
  if (r->resume_context >= 0 && !r->new_context) return "\"resume_context\" without \"new_context\": true";
  return "";
}

}  // namespace

const char* env_error_name(EnvError e) {
  switch (e) {
    case EnvError::None: return "none";
    case EnvError::Model: return "model";
    case EnvError::Tool: return "tool";
    case EnvError::Infra: return "infra";
    case EnvError::Overlong: return "overlong";
  }
  return "?";
}

std::string describe_env_info(const EnvInfo& info) {
  return fmt::format("'{}' (protocol {}, {} concurrent episodes a process, {}deterministic, {}snapshots)", info.name,
                     info.protocol_version, info.max_concurrent_episodes, info.deterministic ? "" : "not ",
                     info.snapshots ? "" : "no ");
}

bool parse_env_error(const std::string& name, EnvError* out) {
  for (EnvError e : {EnvError::None, EnvError::Model, EnvError::Tool, EnvError::Infra, EnvError::Overlong})
    if (name == env_error_name(e)) {
      *out = e;
      return true;
    }
  return false;
}

std::string encode_hello() { return dump({{"type", "hello"}, {"protocol_version", kEnvProtocolVersion}}); }

namespace {

json reset_fields(const char* type, const EpisodeStart& s) {
  json prompt = {{"text", s.prompt}, {"label", s.label}};
  if (!s.metadata_json.empty()) prompt["metadata"] = json::parse(s.metadata_json, nullptr, false);
  return {{"type", type},
          {"episode", s.episode},
          {"step", s.step},
          {"group", s.group},
          {"sample", s.sample},
          {"seed", s.seed},
          {"prompt", prompt},
          {"limits", {{"max_turns", s.max_turns}, {"max_total_tokens", s.max_total_tokens}, {"wall_time_s", s.wall_time_s}}}};
}

}  // namespace

std::string encode_reset(const EpisodeStart& s) { return dump(reset_fields("reset", s)); }

std::string encode_restore(const EpisodeStart& s, int64_t turns, const std::string& snapshot) {
  json j = reset_fields("restore", s);
  j["turns"] = turns;
  j["snapshot"] = json::parse(snapshot);  // an observation's, parsed when it arrived
  return dump(j);
}

std::string encode_step(const EpisodeAction& a) {
  using ojson = nlohmann::ordered_json;  // (a call's arguments in the order the model wrote them)
  ojson calls = ojson::array();
  for (const ToolCall& c : a.tool_calls) {
    ojson call = ojson::object();
    if (c.error.empty()) {
      call["name"] = c.name;
      call["arguments"] = ojson::parse(c.arguments_json, nullptr, false);
    } else {
      call["error"] = c.error;
    }
    call["raw"] = c.raw;
    calls.push_back(call);
  }
  const ojson action = {{"text", a.text}, {"token_ids", a.token_ids}, {"tool_calls", calls}, {"finish_reason", a.finish_reason}};
  const ojson step = {{"type", "step"}, {"episode", a.episode}, {"turn", a.turn}, {"context", a.context}, {"action", action}};
  return step.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::string encode_close(const std::string& episode) { return dump({{"type", "close"}, {"episode", episode}}); }

std::string decode_hello(const std::string& line, EnvInfo* info) {
  const json j = json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return "not a JSON object";
  if (j.value("type", std::string()) != "hello") return "its first line is not {\"type\": \"hello\", ...}";
  if (!j.contains("protocol_version") || !j["protocol_version"].is_number_integer())
    return "no integer \"protocol_version\"";
  info->protocol_version = j["protocol_version"].get<int64_t>();
  if (info->protocol_version != kEnvProtocolVersion)
    return fmt::format("protocol_version {} (slimpi speaks {})", info->protocol_version, kEnvProtocolVersion);
  info->name = j.contains("name") && j["name"].is_string() ? j["name"].get<std::string>() : std::string("?");
  if (j.contains("tools")) {
    if (!j["tools"].is_array()) return "\"tools\" is not a list of function schemas";
    info->tools_json = dump(j["tools"]);
  }
  if (j.contains("max_concurrent_episodes")) {
    const json& m = j["max_concurrent_episodes"];
    if (!m.is_number_integer() || m.get<int64_t>() < 1) return "\"max_concurrent_episodes\" is not an integer >= 1";
    info->max_concurrent_episodes = std::min<int64_t>(m.get<int64_t>(), kMaxConcurrentEpisodes);
  }
  if (j.contains("deterministic")) {
    if (!j["deterministic"].is_boolean()) return "\"deterministic\" is not true or false";
    info->deterministic = j["deterministic"].get<bool>();
  }
  if (j.contains("snapshots")) {
    if (!j["snapshots"].is_boolean()) return "\"snapshots\" is not true or false";
    info->snapshots = j["snapshots"].get<bool>();
  }
  return "";
}

ReplyParse decode_reply(const std::string& raw_line, int64_t vocab_size, EnvReply* r, std::string* error) {
  *r = EnvReply();
  std::string line = raw_line;
  if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF line endings
  json j;
  try {
    j = json::parse(line);
  } catch (const json::parse_error& e) {
    // Not JSON (Python's json.dumps writes NaN, Infinity and lone surrogates that JSON
    // does not allow): when the line still names its episode, only that episode fails.
    static const std::regex named(R"re("episode"\s*:\s*"([^"\\]*)")re");
    std::smatch m;
    *error = fmt::format("not valid JSON ({})", e.what());
    if (std::regex_search(line, m, named)) {
      r->episode = m[1].str();
      return ReplyParse::BadReply;
    }
    return ReplyParse::Garbage;
  }
  if (!j.is_object()) {
    *error = "not a JSON object";
    return ReplyParse::Garbage;
  }
  if (!j.contains("episode") || !j["episode"].is_string()) {
    *error = "no string \"episode\"";
    return ReplyParse::Garbage;
  }
  r->episode = j["episode"].get<std::string>();
  const std::string type = j.value("type", std::string());
  if (type == "error") {  // the environment gives up on the episode
    const std::string cls = j.contains("class") && j["class"].is_string() ? j["class"].get<std::string>() : "";
    if (!parse_env_error(cls, &r->error) || r->error == EnvError::None) {
      *error = fmt::format("an error reply's class is \"{}\" (one of model, tool, infra, overlong)", cls);
      return ReplyParse::BadReply;
    }
    r->message = j.contains("message") && j["message"].is_string() ? j["message"].get<std::string>() : "";
    r->done = true;
    return ReplyParse::Ok;
  }
  if (type == "restored") {  // the answer to a restore: nothing else in it
    for (const auto& [key, v] : j.items())
      if (key != "type" && key != "episode") {
        *error = fmt::format("unknown key \"{}\" in a restored reply (it holds type and episode)", key);
        return ReplyParse::BadReply;
      }
    r->restored = true;
    return ReplyParse::Ok;
  }
  if (type != "observation") {
    *error = fmt::format("type \"{}\" (a reply is \"observation\", \"restored\" or \"error\")", type);
    return ReplyParse::BadReply;
  }
  *error = read_observation(j, vocab_size, r);
  return error->empty() ? ReplyParse::Ok : ReplyParse::BadReply;
}

}  // namespace slimpi
