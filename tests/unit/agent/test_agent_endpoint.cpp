// The agent endpoint (docs/agents.md): OpenAI chat completions parsed and checked, model
// turns written back (reasoning, tool calls), conversations rendered with their tools; and
// the endpoint itself served to the real `openai` Python client
// (tests/fixtures/agents/endpoint_probe.py, a real process over real HTTP), with this test
// playing the episode runner: every error status, a session's requests at once answered in
// turn (429 past rollout.agent_max_session_requests),
// a tool call's round trip, the episode's turns as observations, the reward, a
// conversation over the context (413), and a parent and its sub-agent as two threads.
#include <gtest/gtest.h>
#include <slimpi/error.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fmt/format.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "agent/agent_token.h"
#include "agent/openai_chat.h"
#include "agent/openai_responses.h"
#include "env/agent_environment.h"
#include "tokenizer/tool_calls.h"

namespace slimpi {
namespace {

using nlohmann::json;

int status_of(const std::string& body) {
  ChatCompletionRequest r;
  const std::optional<ApiError> e = parse_chat_completion(body, &r);
  return e ? e->status : 200;
}

std::string param_of(const std::string& body) {
  ChatCompletionRequest r;
  const std::optional<ApiError> e = parse_chat_completion(body, &r);
  return e ? e->param : "";
}

TEST(OpenAiChat, RequestsCheckedFieldByField) {
  const std::string user = R"("messages": [{"role": "user", "content": "hi"}])";
  EXPECT_EQ(status_of(R"({"model": "m", )" + user + "}"), 200);
  EXPECT_EQ(status_of("{not json"), 400);
  EXPECT_EQ(status_of("[1]"), 400);
  EXPECT_EQ(param_of("{" + user + "}"), "model");
  EXPECT_EQ(param_of(R"({"model": "m", "messages": []})"), "messages");
  EXPECT_EQ(param_of(R"({"model": "m", "messages": [{"role": "function", "content": "x"}]})"), "messages[0].role");
  EXPECT_EQ(param_of(R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"),
            "messages[0].content[0]");
  EXPECT_EQ(param_of(R"({"model": "m", "n": 2, )" + user + "}"), "n");
  EXPECT_EQ(param_of(R"({"model": "m", "temperature": 2.5, )" + user + "}"), "temperature");
  EXPECT_EQ(param_of(R"({"model": "m", "temperature": "hot", )" + user + "}"), "temperature");
  EXPECT_EQ(param_of(R"({"model": "m", "stop": ["a", 1], )" + user + "}"), "stop");
  EXPECT_EQ(param_of(R"({"model": "m", "stream": "yes", )" + user + "}"), "stream");
  EXPECT_EQ(param_of(R"({"model": "m", "tools": [{"type": "function"}], )" + user + "}"), "tools[0]");
  EXPECT_EQ(param_of(R"({"model": "m", "messages": [{"role": "user", "content": "x", "tool_calls": []}]})"),
            "messages[0].tool_calls");
  // null where a boolean or an object goes: as if absent (not a 500)
  EXPECT_EQ(status_of(R"({"model": "m", "stream": null, "logprobs": null, "stream_options": null, )" + user + "}"), 200);
  EXPECT_EQ(param_of(R"({"model": "m", "tools": [{"type": 5}], )" + user + "}"), "tools[0]");

  ChatCompletionRequest r;  // text parts joined, developer read as system, the echoed tool call kept
  ASSERT_FALSE(parse_chat_completion(R"({"model": "m", "stream": true, "stream_options": {"include_usage": true},
      "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                   {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "f", "arguments": "{\"y\":1,\"x\":[2]}"}}]}]})", &r));
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "ab");
  EXPECT_EQ(r.messages[1].content, "");
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments_json, R"({"y": 1, "x": [2]})");
}

// Python: json.dumps({"b": 1, "a": [1, 2.5, "x\u00e9\n"], "c": {}, "d": None, "e": True}, ensure_ascii=False)
TEST(OpenAiChat, PythonJsonDumpsAsTransformersTojson) {
  const auto v = nlohmann::ordered_json::parse(R"({"b": 1, "a": [1, 2.5, "xé\n"], "c": {}, "d": null, "e": true})");
  EXPECT_EQ(python_json_dumps(v), "{\"b\": 1, \"a\": [1, 2.5, \"xé\\n\"], \"c\": {}, \"d\": null, \"e\": true}");
}

TEST(OpenAiChat, TurnsSplitIntoReasoningContentAndToolCalls) {
  const std::string text =
      "<think>\nadd them\n</think>\n\nLet me compute. <tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": "
      "\"1+1\"}}\n</tool_call>";
  const std::vector<ToolCall> calls = parse_tool_calls(text, ChatTemplate::Qwen3);
  const std::string stop = "stop";
  const AssistantTurn t = assistant_turn({text, calls, stop, 2, 40, 31}, ChatTemplate::Qwen3);
  EXPECT_EQ(t.reasoning, "add them");
  EXPECT_EQ(t.content, "Let me compute.");
  ASSERT_EQ(t.tool_calls.size(), 1u);
  EXPECT_EQ(t.tool_calls[0].id, "call_2_0");
  EXPECT_EQ(t.tool_calls[0].name, "calc");
  EXPECT_EQ(t.tool_calls[0].arguments_json, R"({"expr": "1+1"})");
  EXPECT_EQ(t.finish_reason, "tool_calls");
  const json j = json::parse(chat_completion_json(t, "id1", "m", 7));
  EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "add them");
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], R"({"expr": "1+1"})");
  EXPECT_EQ(j["usage"]["total_tokens"], 71);
  const std::string events = chat_completion_events(t, "id1", "m", 7, true);
  EXPECT_EQ(events.substr(events.size() - 14), "data: [DONE]\n\n");
  EXPECT_NE(events.find("\"usage\""), std::string::npos);
  // chatml reads no reasoning; invalid UTF-8 reaches the client as U+FFFD, untrimmed text as sampled
  const std::string raw = " caf\xc3 <think>";
  const std::string length = "length";
  const AssistantTurn u = assistant_turn({raw, {}, length, 1, 1, 1}, ChatTemplate::ChatML);
  EXPECT_EQ(u.content, " caf\xef\xbf\xbd <think>");
  EXPECT_EQ(u.finish_reason, "length");
  EXPECT_TRUE(as_message(t).same_as(AgentMessage{"assistant", "Let me compute.", {{"other_id", "calc", R"({"expr":"1+1"})"}}}));
  EXPECT_FALSE(as_message(t).same_as(AgentMessage{"assistant", "Let me compute.", {{"x", "calc", R"({"expr":"2"})"}}}));
}

TEST(OpenAiChat, ToolsWrittenIntoTheSystemMessageAsQwenDoes) {
  std::vector<AgentMessage> m = {{"user", "hi", {}}, {"assistant", "", {{"c", "f", R"({"a": 1})"}}}, {"tool", "2", {}}};
  const std::vector<std::string> tools = {R"({"type": "function", "function": {"name": "f"}})"};
  ChatFormat qwen3;
  qwen3.chat_template = ChatTemplate::Qwen3;
  std::vector<ChatMessage> out;
  ASSERT_EQ(conversation_messages(m, tools, qwen3, &out), "");
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].role, "system");
  EXPECT_EQ(out[0].content.substr(0, 8), "# Tools\n");
  EXPECT_NE(out[0].content.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\"}}\n</tools>"),
            std::string::npos);
  EXPECT_EQ(out[2].content, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>");
  m.insert(m.begin(), AgentMessage{"system", "Be brief.", {}});
  ASSERT_EQ(conversation_messages(m, tools, qwen3, &out), "");
  EXPECT_EQ(out[0].content.substr(0, 18), "Be brief.\n\n# Tools");
  ChatFormat llama3;
  llama3.chat_template = ChatTemplate::Llama3;
  EXPECT_NE(conversation_messages(m, tools, llama3, &out), "");
}

TEST(OpenAiChat, LogprobsGiveEachSampledTokenAsReceived) {
  const std::string text = "ab\xc3";
  const std::vector<std::string> pieces = {"a", "b", "\xc3"};
  const std::vector<float> lps = {-0.5f, -0.25f, -2.0f};
  const std::string stop = "stop";
  const AssistantTurn t = assistant_turn({text, {}, stop, 1, 4, 4, &pieces, &lps}, ChatTemplate::ChatML);
  const json j = json::parse(chat_completion_json(t, "id", "m", 0, /*with_logprobs=*/true));
  const json& c = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0], json::parse(R"({"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []})"));
  EXPECT_EQ(c[2]["token"], "\xef\xbf\xbd");  // a token ending inside a character: its bytes say which
  EXPECT_EQ(c[2]["bytes"], json::parse("[195]"));
  EXPECT_TRUE(json::parse(chat_completion_json(t, "id", "m", 0))["choices"][0]["logprobs"].is_null());
  ChatCompletionRequest r;
  EXPECT_EQ(parse_chat_completion(R"({"model": "m", "logprobs": true, "messages": [{"role": "user", "content": "x"}]})", &r),
            std::nullopt);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(param_of(R"({"model": "m", "top_logprobs": 3, "messages": [{"role": "user", "content": "x"}]})"),
            "top_logprobs");
}

std::string responses_param(const std::string& body) {
  ResponsesRequest r;
  const std::optional<ApiError> e = parse_responses_request(body, &r);
  return e ? e->param : "ok";
}

TEST(OpenAiResponses, InputItemsReadAsTheConversation) {
  ResponsesRequest r;
  ASSERT_EQ(parse_responses_request(R"({"model": "m", "instructions": "Be brief.", "include": ["message.output_text.logprobs"],
      "tools": [{"type": "function", "name": "calc", "parameters": {"type": "object"}, "strict": true}],
      "input": [{"role": "user", "content": "2*3?"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sure.", "annotations": []}]},
                {"type": "function_call", "call_id": "call_1_0", "name": "calc", "arguments": "{\"expr\":\"2*3\"}"},
                {"type": "function_call_output", "call_id": "call_1_0", "output": "6"},
                {"type": "function_call", "call_id": "c2", "name": "calc", "arguments": "{}"}]})", &r),
            std::nullopt);
  EXPECT_TRUE(r.has_instructions);
  EXPECT_TRUE(r.chat.logprobs);
  ASSERT_EQ(r.chat.messages.size(), 5u);
  EXPECT_EQ(r.chat.messages[0].role, "system");
  EXPECT_EQ(r.chat.messages[0].content, "Be brief.");
  EXPECT_TRUE(r.chat.messages[2].same_as(AgentMessage{"assistant", "Sure.", {{"x", "calc", R"({"expr": "2*3"})"}}}));
  EXPECT_EQ(r.chat.messages[3].role, "tool");
  EXPECT_EQ(r.chat.messages[4].role, "assistant");  // a call after a tool's output: an assistant message of its own
  ASSERT_EQ(r.chat.tools.size(), 1u);  // written as chat completions' function tool
  EXPECT_EQ(r.chat.tools[0], R"({"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}})");
  ASSERT_EQ(parse_responses_request(R"({"model": "m", "input": "hi", "previous_response_id": "resp_a_1"})", &r),
            std::nullopt);
  EXPECT_EQ(r.previous_response_id, "resp_a_1");
  EXPECT_EQ(r.chat.messages.size(), 1u);

  EXPECT_EQ(responses_param(R"({"input": "hi"})"), "model");
  EXPECT_EQ(responses_param(R"({"model": "m"})"), "input");
  EXPECT_EQ(responses_param(R"({"model": "m", "input": []})"), "input");
  EXPECT_EQ(responses_param(R"({"model": "m", "input": [{"role": "tool", "content": "x"}]})"), "input[0].role");
  EXPECT_EQ(responses_param(R"({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image"}]}]})"),
            "input[0].content[0]");
  EXPECT_EQ(responses_param(R"({"model": "m", "input": [{"type": "function_call", "name": "f"}]})"), "input[0].call_id");
  EXPECT_EQ(responses_param(R"({"model": "m", "input": [{"type": "item_reference", "id": "x"}]})"), "input[0].type");
  EXPECT_EQ(responses_param(R"({"model": "m", "input": "x", "tools": [{"type": "web_search"}]})"), "tools[0]");
  EXPECT_EQ(responses_param(R"({"model": "m", "input": "x", "background": true})"), "background");
  EXPECT_EQ(responses_param(R"({"model": "m", "input": "x", "temperature": 3})"), "temperature");
  EXPECT_EQ(responses_param(R"({"model": "m", "input": "x", "top_logprobs": 2})"), "top_logprobs");
  EXPECT_EQ(responses_param(R"({"model": "m", "input": [{"type": 5}]})"), "input[0].type");
  EXPECT_EQ(responses_param(R"({"model": "m", "input": "x", "stream": null, "tools": [{"type": null}]})"), "tools[0]");
}

TEST(OpenAiResponses, TurnsWrittenAsOutputItemsAndEvents) {
  const std::string text = "<think>\nadd\n</think>\n\nSure.<tool_call>\n{\"name\": \"calc\", \"arguments\": {}}\n</tool_call>";
  const std::vector<ToolCall> calls = parse_tool_calls(text, ChatTemplate::Qwen3);
  const std::string stop = "stop";
  const AssistantTurn t = assistant_turn({text, calls, stop, 3, 40, 20}, ChatTemplate::Qwen3);
  const json j = json::parse(response_json(t, "resp_s_3", "m", 9, false));
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["status"], "completed");
  ASSERT_EQ(j["output"].size(), 3u);
  EXPECT_EQ(j["output"][0]["type"], "reasoning");
  EXPECT_EQ(j["output"][0]["content"][0]["text"], "add");
  EXPECT_EQ(j["output"][1]["content"][0], json::parse(R"({"type": "output_text", "text": "Sure.", "annotations": []})"));
  EXPECT_EQ(j["output"][2]["call_id"], "call_3_0");
  EXPECT_EQ(j["output"][2]["arguments"], "{}");
  EXPECT_EQ(j["usage"]["total_tokens"], 60);
  // The events: created, in_progress, each item added ... done, completed; sequence numbers in order.
  const std::string events = response_events(t, "resp_s_3", "m", 9, false);
  std::vector<std::string> types;
  int64_t seq = 0;
  for (size_t at = events.find("data: "); at != std::string::npos; at = events.find("data: ", at + 1)) {
    const json e = json::parse(events.substr(at + 6, events.find('\n', at) - at - 6));
    EXPECT_EQ(e["sequence_number"], seq++);
    types.push_back(e["type"]);
  }
  EXPECT_EQ(types.front(), "response.created");
  EXPECT_EQ(types.back(), "response.completed");
  EXPECT_EQ(std::count(types.begin(), types.end(), "response.output_item.done"), 3);
  // A turn cut at its token limit: incomplete.
  const std::string length = "length";
  const AssistantTurn cut = assistant_turn({"abc", {}, length, 1, 1, 3}, ChatTemplate::ChatML);
  const json k = json::parse(response_json(cut, "resp_s_1", "m", 9, false));
  EXPECT_EQ(k["status"], "incomplete");
  EXPECT_EQ(k["incomplete_details"]["reason"], "max_output_tokens");
}

// ---- the endpoint, with the real openai client ----

std::string clients_python() {
  const char* v = std::getenv("SLIMPI_AGENT_CLIENTS_VENV");
  return std::string(v ? v : "/opt/slimpi/agent-clients") + "/bin/python";
}

struct EndpointFixture : ::testing::Test {
  std::filesystem::path dir, log;
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(clients_python())) << clients_python() << ": run scripts/install_deps.sh";
    dir = std::filesystem::temp_directory_path() /
          ("slimpi_agent_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    log = dir / "probe.log";
    ASSERT_EQ(write_agent_token(dir.string()), "");
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  EnvConfig config(const std::string& args, const std::string& probe = "endpoint_probe.py") const {
    EnvConfig c;
    c.name = "agent";
    c.agent_command = clients_python() + " " + SLIMPI_SOURCE_DIR + "/tests/fixtures/agents/" + probe + " --log " +
                      log.string() + " " + args;
    c.run_dir = dir.string();
    c.timeout_s = 120;
    c.agent_max_request_bytes = 65536;
    c.chat.chat_template = ChatTemplate::ChatML;
    return c;
  }
  // Episode 0/0/0 reset with `prompt`: the agent's first request, as the reset's reply.
  static EnvReply start_episode(AgentEnvironment& env, const std::string& prompt) {
    EpisodeStart start;
    start.episode = "0/0/0";
    start.prompt = prompt;
    env.reset(start);
    return next_reply(env);
  }
  // The runner's wait for one reply.
  static EnvReply next_reply(AgentEnvironment& env) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      std::vector<EnvReply> r = env.poll(0.05);
      if (!r.empty()) {
        EXPECT_EQ(r.size(), 1u);
        return r[0];
      }
    }
    ADD_FAILURE() << "no reply within 120 s";
    return {};
  }
  // The probe's log line for `check`, once written.
  json logged(const std::string& check) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream in(log);
      for (std::string line; std::getline(in, line);) {
        const json j = json::parse(line, nullptr, false);
        if (j.is_object() && j.value("check", "") == check) return j;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "the probe logged no '" << check << "' within 120 s";
    return json::object();
  }
  // Every line the probe logged (once the agent has exited: all of them).
  std::vector<json> log_lines() const {
    std::vector<json> out;
    std::ifstream in(log);
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  // The runner's next reply is the agent's exit, with `reward`.
  static void expect_exit(AgentEnvironment& env, double reward) {
    const EnvReply r = next_reply(env);
    EXPECT_TRUE(r.done) << "not the agent's exit";
    EXPECT_FALSE(r.failed) << r.message;
    EXPECT_EQ(r.reward, reward);
  }
  // The model's first turn, a calc tool call; the reply: the agent's next request, whose one
  // new message is the tool's result `content`, extending the history.
  static EnvReply answered_with_a_tool_call(AgentEnvironment& env, const std::string& preface,
                                            const std::string& content) {
    env.step(turn(1, preface + "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": \"2*3\"}}\n</tool_call>"));
    EnvReply r = next_reply(env);
    EXPECT_FALSE(r.failed) << r.message;
    EXPECT_FALSE(r.new_context);
    EXPECT_EQ(r.messages.size(), 1u);
    if (!r.messages.empty()) {
      EXPECT_EQ(r.messages[0].role, "tool");
      EXPECT_EQ(r.messages[0].content, content);
    }
    return r;
  }
  static EpisodeAction turn(int64_t n, const std::string& text) {
    EpisodeAction a;
    a.episode = "0/0/0";
    a.turn = n;
    a.text = text;
    a.token_ids = std::vector<int64_t>(size_t(3 * n), 1);
    a.tool_calls = parse_tool_calls(text, ChatTemplate::ChatML);
    a.finish_reason = "stop";
    a.context_tokens = 10 * n;
    return a;
  }
};

TEST_F(EndpointFixture, ServesTheOpenAIClient) {
  EnvConfig c = config("");
  c.agent_max_session_requests = 1;  // a second request at once is refused (RequestsAtOnceAreAnsweredInTurn: more)
  AgentEnvironment env(c);
  EnvReply r = start_episode(env, "what is 2*3?");  // the first request to get through: the reset's context
  ASSERT_FALSE(r.failed) << r.message;
  ASSERT_EQ(r.messages.size(), 2u);  // the tools' system message, then the task
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_NE(r.messages[0].content.find("{\"type\": \"function\", \"function\": {\"name\": \"calc\"}}"), std::string::npos);
  EXPECT_EQ(r.messages[1].content, "what is 2*3?");

  const json e = logged("errors");
  EXPECT_EQ(e["bad_key"], json::parse("[401, \"invalid_api_key\"]"));
  EXPECT_EQ(e["no_auth"], 401);
  EXPECT_EQ(e["other_model"], json::parse("[404, \"model_not_found\"]"));
  EXPECT_EQ(e["unknown_session"], json::parse("[404, \"session_not_found\"]"));
  EXPECT_EQ(e["x_api_key_route"], 404);  // the key accepted as x-api-key; the route unknown
  for (const char* k : {"no_messages", "image", "n2", "hot"}) EXPECT_EQ(e[k][0], 400) << k;
  EXPECT_EQ(e["malformed"], 400);
  EXPECT_EQ(e["big"], json::parse("[413, \"request_too_large\"]"));
  EXPECT_EQ(e["models"], json::parse("[\"slimpi-policy\"]"));
  EXPECT_EQ(logged("busy")["statuses"], json::parse("[0, 429]"));  // one waits for the runner, one refused

  r = answered_with_a_tool_call(env, "Let me compute.", "2");  // after the call sent back as the client returned it
  EXPECT_EQ(r.conversation.size(), 4u);
  const json call = logged("tool_call");
  EXPECT_EQ(call["content"], "Let me compute.");
  EXPECT_EQ(call["calls"], json::parse(R"([{"id": "call_1_0", "name": "calc", "arguments": {"expr": "2*3"}}])"));
  EXPECT_EQ(call["finish"], "tool_calls");
  EXPECT_EQ(call["usage"], json::parse("[10, 3]"));

  env.step(turn(2, " It is 6."));
  r = next_reply(env);  // the agent's exit: its reward
  EXPECT_TRUE(r.done);
  EXPECT_FALSE(r.failed) << r.message;
  EXPECT_EQ(r.reward, 0.75);
  const json streamed = logged("streamed");
  EXPECT_EQ(streamed["content"], " It is 6.");
  EXPECT_EQ(streamed["finish"], "stop");
  env.close("0/0/0");
}

TEST_F(EndpointFixture, ServesTheAnthropicClient) {
  AgentEnvironment env(config("", "anthropic_probe.py"));
  EnvReply r = start_episode(env, "what is 2*3?");
  ASSERT_FALSE(r.failed) << r.message;
  ASSERT_EQ(r.messages.size(), 2u);  // system: its text, then the tools as OpenAI function tools
  EXPECT_EQ(r.messages[0].content.substr(0, 18), "Be brief.\n\n# Tools");
  EXPECT_NE(r.messages[0].content.find("{\"type\": \"function\", \"function\": {\"name\": \"calc\", \"description\": "
                                       "\"Evaluates an expression.\", \"parameters\": {\"type\": \"object\""),
            std::string::npos);
  const json e = logged("errors");
  EXPECT_EQ(e["bad_key"], json::parse(R"([401, "authentication_error"])"));
  EXPECT_EQ(e["other_model"], json::parse(R"([404, "not_found_error"])"));
  EXPECT_EQ(e["no_max_tokens"], json::parse(R"([400, "invalid_request_error"])"));
  EXPECT_EQ(e["image"], json::parse(R"([400, "invalid_request_error"])"));

  answered_with_a_tool_call(env, "Sure.", "6");  // the tool_result block, after the answer's blocks sent back
  const json first = logged("first");
  EXPECT_EQ(first["blocks"], json::parse(R"([{"type": "text", "text": "Sure."},
      {"type": "tool_use", "id": "toolu_1_0", "name": "calc", "input": {"expr": "2*3"}}])"));
  EXPECT_EQ(first["stop"], "tool_use");
  EXPECT_EQ(first["usage"], json::parse("[10, 3]"));

  env.step(turn(2, "6"));
  r = next_reply(env);
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.reward, 0.5);
  const json streamed = logged("streamed");
  EXPECT_EQ(streamed["text"], "6");
  EXPECT_EQ(streamed["stop"], "end_turn");
  env.close("0/0/0");
}

// The Responses API: output items, previous_response_id (the tool's output appended to the
// stored conversation: the history extends), a streamed answer with its logprobs, the whole
// conversation sent back as input items (extends again).
TEST_F(EndpointFixture, ServesTheOpenAIResponsesClient) {
  AgentEnvironment env(config("", "responses_probe.py"));
  EnvReply r = start_episode(env, "what is 2*3?");
  ASSERT_FALSE(r.failed) << r.message;
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].content.substr(0, 18), "Be brief.\n\n# Tools");
  EXPECT_EQ(r.messages[1].content, "what is 2*3?");
  const json e = logged("errors");
  EXPECT_EQ(e["web_search"], json::parse(R"([400, "tools[0]"])"));
  EXPECT_EQ(e["image"], json::parse(R"([400, "input[0].content[0]"])"));
  EXPECT_EQ(e["background"], json::parse(R"([400, "background"])"));
  EXPECT_EQ(e["unknown_previous"], json::parse(R"([400, "previous_response_id"])"));

  answered_with_a_tool_call(env, "Sure.", "6");  // the function_call_output after previous_response_id
  const json first = logged("first");
  EXPECT_EQ(first["types"], json::parse(R"(["message", "function_call"])"));
  EXPECT_EQ(first["text"], "Sure.");
  EXPECT_EQ(first["calls"], json::parse(R"([{"call_id": "call_1_0", "name": "calc", "arguments": {"expr": "2*3"}}])"));
  EXPECT_EQ(first["usage"], json::parse("[10, 3]"));

  EpisodeAction second = turn(2, " It is 6.");
  second.token_texts = {" It", " is", " 6", "."};
  second.log_probs = {-0.125f, -0.5f, -1.0f, -0.0625f};
  env.step(second);
  r = next_reply(env);  // the whole conversation again, the outputs as returned: it extends
  ASSERT_FALSE(r.failed) << r.message;
  EXPECT_FALSE(r.new_context);
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].content, "thanks");
  const json streamed = logged("streamed");
  EXPECT_EQ(streamed["deltas"], " It is 6.");
  EXPECT_EQ(streamed["text"], " It is 6.");
  EXPECT_EQ(streamed["status"], "completed");
  EXPECT_EQ(streamed["logprobs"], json::parse(R"([[" It", -0.125, [32, 73, 116]], [" is", -0.5, [32, 105, 115]],
                                                  [" 6", -1.0, [32, 54]], [".", -0.0625, [46]]])"));

  env.step(turn(3, "ok"));
  r = next_reply(env);
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.reward, 0.25);
  EXPECT_EQ(logged("third")["text"], "ok");
  env.close("0/0/0");
}

// A parent agent and its sub-agent in one session (tests/fixtures/agents/threads_probe.py):
// each request continues the conversation it extends. The sub-agent's first opens a new
// context; its second extends it; the parent's return resumes the parent's context (the
// runner numbers contexts in EpisodeAction::context), its one new message the delta; so
// does the sub-agent's return.
TEST_F(EndpointFixture, ARequestContinuesTheThreadItExtends) {
  AgentEnvironment env(config("", "threads_probe.py"));
  EnvReply r = start_episode(env, "find x");
  ASSERT_FALSE(r.failed) << r.message;
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].content, "parent");
  auto answer = [&](int64_t n, int64_t context, const std::string& text) {
    EpisodeAction a = turn(n, text);
    a.context = context;
    env.step(a);
    return next_reply(env);
  };
  r = answer(1, 0, "ask the sub-agent");  // the sub-agent's first request: a new thread
  ASSERT_FALSE(r.failed) << r.message;
  EXPECT_TRUE(r.new_context);
  EXPECT_EQ(r.resume_context, -1);
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].content, "sub");
  r = answer(2, 1, "x is");  // its second: extends its own thread
  EXPECT_FALSE(r.new_context);
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].content, "go on");
  r = answer(3, 1, "42");  // the parent's return: its context 0 resumed with the one new message
  EXPECT_TRUE(r.new_context);
  EXPECT_EQ(r.resume_context, 0);
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].content, "the sub-agent says: 42");
  EXPECT_EQ(r.conversation.size(), 4u);
  r = answer(4, 2, "x = 42");  // the sub-agent's return: context 1, which it was last answered in
  EXPECT_TRUE(r.new_context);
  EXPECT_EQ(r.resume_context, 1);
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].content, "once more");
  r = answer(5, 3, "done");
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.reward, 1.0);
  const json t = logged("threads");
  EXPECT_EQ(t["parent"][4]["content"], "x = 42");
  EXPECT_EQ(t["sub"][6]["content"], "done");
  env.close("0/0/0");
}

// Sub-agents calling in parallel: a session's requests at once are answered one after
// another in the order they arrived, each with its own turn (the second a conversation of
// its own: a new context); past rollout.agent_max_session_requests (2 here) one gets 429.
TEST_F(EndpointFixture, RequestsAtOnceAreAnsweredInTurn) {
  EnvConfig c = config("--at-once 3");
  c.agent_max_session_requests = 2;
  AgentEnvironment env(c);
  EnvReply r = start_episode(env, "hi");  // the first request to arrive
  ASSERT_FALSE(r.failed) << r.message;
  ASSERT_EQ(r.messages.size(), 1u);
  const std::string first = r.messages[0].content;
  // Nothing is answered yet, so the one line logged so far is the third request's refusal.
  const json refused = logged("at_once");
  EXPECT_EQ(refused["status"], 429);
  EXPECT_EQ(refused["code"], "session_busy");
  env.step(turn(1, "answer to " + first));
  r = next_reply(env);  // the request that waited for its turn
  ASSERT_FALSE(r.failed) << r.message;
  EXPECT_TRUE(r.new_context);
  ASSERT_EQ(r.messages.size(), 1u);
  const std::string second = r.messages[0].content;
  EXPECT_NE(second, first);
  EpisodeAction a = turn(2, "answer to " + second);
  a.context = 1;
  env.step(a);
  expect_exit(env, 0.5);
  std::map<int, json> by_task;
  for (const json& j : log_lines()) by_task[j["task"].get<int>()] = j;
  ASSERT_EQ(by_task.size(), 3u);
  int answered = 0;
  for (const auto& [k, j] : by_task) {
    if (j["status"] == 429) continue;
    EXPECT_EQ(j["status"], 200);
    EXPECT_EQ(j["content"], fmt::format("answer to task {}", k));  // each request its own answer
    ++answered;
  }
  EXPECT_EQ(answered, 2);
  env.close("0/0/0");
}

// Requests waiting for their turn leave when the runner stops the episode (end()): the one
// in flight and the one waiting (or arriving after the stop) each get the episode's 404,
// and the agent's exit ends the episode with its reward.
TEST_F(EndpointFixture, RequestsWaitingForTheirTurnLeaveWhenTheEpisodeStops) {
  AgentEnvironment env(config("--at-once 2"));
  EnvReply r = start_episode(env, "hi");
  ASSERT_FALSE(r.failed) << r.message;
  env.end("0/0/0", EnvError::None, "it reached rollout.env_max_turns = 1 model turns");
  expect_exit(env, 0.5);  // once both requests had their answers
  const std::vector<json> lines = log_lines();
  EXPECT_EQ(lines.size(), 2u);
  for (const json& j : lines) {
    EXPECT_EQ(j["status"], 404) << j.dump();
    EXPECT_EQ(j["code"], "session_ended") << j.dump();
  }
  env.close("0/0/0");
}

// An agent that exits while a request of its session waits for its turn: that request is
// dropped (nobody reads its answer), so after the runner answers the one in flight, the
// agent's exit ends the episode; no turn is taken for the dropped one.
TEST_F(EndpointFixture, ARequestWaitingForItsTurnIsDroppedWhenItsAgentExits) {
  AgentEnvironment env(config("--at-once 2 --exit-early"));
  EnvReply r = start_episode(env, "hi");
  ASSERT_FALSE(r.failed) << r.message;
  // Wait until the agent has exited (a zombie: this process has not reaped it), then let
  // the environment notice it.
  const int pid = logged("exiting")["pid"].get<int>();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  auto zombie = [pid] {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    return close == std::string::npos || line.substr(close + 2, 1) == "Z";
  };
  while (!zombie() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(zombie());
  EXPECT_TRUE(env.poll(0).empty());  // noticed; the runner does not wait for a reply yet
  env.step(turn(1, "an answer nobody reads"));
  expect_exit(env, 0.5);  // not an observation: the waiting request was dropped
  env.close("0/0/0");
}

TEST_F(EndpointFixture, AnEpisodeEndedOverItsContextAnswers413) {
  AgentEnvironment env(config("--only-one"));
  EnvReply r = start_episode(env, "hi");
  ASSERT_FALSE(r.failed) << r.message;
  env.ended("0/0/0", EnvError::Overlong, "an observation of 2000 tokens");
  const json one = logged("only_one");
  EXPECT_EQ(one["status"], 413);
  EXPECT_EQ(one["code"], "context_length_exceeded");
  env.close("0/0/0");
}

// The runner stops an episode at a limit (Environment::end): the request in flight gets 404,
// and the agent's exit, with no reward and whatever its status, still ends the episode with
// reward 0 (an unmodified client raises on the 404).
TEST_F(EndpointFixture, AnEpisodeStoppedAtItsLimitEndsAtItsAgentsExit) {
  AgentEnvironment env(config("--only-one"));
  EXPECT_TRUE(env.rewards_at_end());
  EnvReply r = start_episode(env, "hi");
  ASSERT_FALSE(r.failed) << r.message;
  env.end("0/0/0", EnvError::None, "it reached rollout.env_max_turns = 1 model turns");
  const json one = logged("only_one");
  EXPECT_EQ(one["status"], 404);
  EXPECT_EQ(one["code"], "session_ended");
  EXPECT_NE(one["message"].get<std::string>().find("env_max_turns"), std::string::npos);
  r = next_reply(env);
  EXPECT_FALSE(r.failed) << r.message;
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.reward, 0.0);
  env.close("0/0/0");
}

}  // namespace
}  // namespace slimpi
