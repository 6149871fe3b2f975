// The environment protocol's parts: tool calls parsed from model text, the chat
// template's delta for an observation (and the refusal of a template that rewrites
// history), reply validation, the calculator, and the Python calculator
// (inputs/envs/calculator.py, a real process) giving the in-process one's replies.
#include <gtest/gtest.h>
#include <slimpi/error.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "core/child_process.h"
#include "env/calculator_environment.h"
#include "env/command_environment.h"
#include "env/env_protocol.h"
#include "tokenizer/chat_transcript.h"
#include "tokenizer/tool_calls.h"

namespace slimpi {
namespace {

TEST(ToolCalls, QwenBlocksParsedWithTheirRawText) {
  const std::string text =
      "let me compute <tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"2*3\"}}\n</tool_call>"
      "<tool_call>{\"name\": \"calculator\", \"arguments\": \"{\\\"expression\\\": \\\"1+1\\\"}\"}</tool_call>"
      "<tool_call>{not json}</tool_call><tool_call>{\"name\": \"x\"";
  const std::vector<ToolCall> calls = parse_tool_calls(text, ChatTemplate::ChatML);
  ASSERT_EQ(calls.size(), 4u);
  EXPECT_EQ(calls[0].name, "calculator");
  EXPECT_EQ(calls[0].arguments_json, "{\"expression\":\"2*3\"}");
  EXPECT_EQ(calls[0].error, "");
  EXPECT_EQ(calls[0].raw.substr(0, 11), "<tool_call>");
  EXPECT_EQ(calls[1].arguments_json, "{\"expression\":\"1+1\"}");  // arguments given as a JSON string
  EXPECT_EQ(calls[2].error, "not valid JSON");
  EXPECT_EQ(calls[2].raw, "<tool_call>{not json}</tool_call>");
  EXPECT_EQ(calls[3].error, "no closing </tool_call>");
  EXPECT_TRUE(parse_tool_calls("no calls here", ChatTemplate::Qwen3).empty());
  EXPECT_EQ(tool_call_stop(ChatTemplate::ChatML), "</tool_call>");
  // The arguments keep the order the model wrote them in (a client sees the model's call).
  const std::vector<ToolCall> ordered = parse_tool_calls(
      R"(<tool_call>{"name": "write_file", "arguments": {"path": "a.py", "content": "x", "mode": {"z": 1, "a": 2}}})"
      "</tool_call>", ChatTemplate::Qwen3);
  ASSERT_EQ(ordered.size(), 1u);
  EXPECT_EQ(ordered[0].arguments_json, R"({"path":"a.py","content":"x","mode":{"z":1,"a":2}})");
}

TEST(ToolCalls, Llama3TurnIsOneJsonCall) {
  auto calls = parse_tool_calls(" {\"name\": \"calculator\", \"parameters\": {\"expression\": \"4\"}}", ChatTemplate::Llama3);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "calculator");
  EXPECT_EQ(calls[0].arguments_json, "{\"expression\":\"4\"}");
  EXPECT_TRUE(parse_tool_calls("The answer is 4.", ChatTemplate::Llama3).empty());
  EXPECT_EQ(parse_tool_calls("{\"parameters\": {}}", ChatTemplate::Llama3)[0].error,
            "not an object with a string \"name\"");
}

// GLM-4.5 writes strings raw and other values as JSON (its template: `v | tojson if v is
// not string else v`), with or without GLM-4.7's newlines.
TEST(ToolCalls, GlmKeyValueBlocks) {
  const std::string text =
      "<think>plan</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
      "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{\"unit\": \"C\"}"
      "</arg_value>\n</tool_call>"
      "<tool_call>now</tool_call>"
      "<tool_call>f<arg_key>a</arg_key><arg_value>x y</arg_value><arg_key>a</arg_key><arg_value>2</arg_value></tool_call>"
      "<tool_call><arg_key>a</arg_key><arg_value>1</arg_value></tool_call>"
      "<tool_call>g<arg_key>a</arg_key>oops</tool_call>"
      "<tool_call>h\n<arg_key>b";
  const std::vector<ToolCall> calls = parse_tool_calls(text, ChatTemplate::Glm45);
  ASSERT_EQ(calls.size(), 6u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(calls[0].arguments_json, R"({"city":"Paris","days":3,"opts":{"unit":"C"}})");
  EXPECT_EQ(calls[0].error, "");
  EXPECT_EQ(calls[0].raw.substr(0, 22), "<tool_call>get_weather");
  EXPECT_EQ(calls[1].name, "now");  // no arguments
  EXPECT_EQ(calls[1].arguments_json, "{}");
  EXPECT_EQ(calls[2].error, "argument 'a' given twice");
  EXPECT_EQ(calls[3].error, "no function name before the arguments");
  EXPECT_EQ(calls[4].error, "an <arg_key> without its </arg_key> <arg_value>...</arg_value>");
  EXPECT_EQ(calls[5].error, "no closing </tool_call>");
  EXPECT_EQ(tool_call_stop(ChatTemplate::Glm45), "</tool_call>");
  EXPECT_EQ(parse_tool_calls(text, ChatTemplate::Glm47).size(), 6u);  // GLM-4.7 writes the same blocks
  EXPECT_EQ(tool_call_stop(ChatTemplate::Glm47), "</tool_call>");
}

// Qwen3.5 (Qwen3-Coder's XML form): one newline trimmed off each end of a value; a value
// that parses as JSON is that value, any other the string.
TEST(ToolCalls, Qwen3_5XmlFunctionBlocks) {
  const std::string text =
      "I will look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"unit\": \"C\"}\n</parameter>\n"
      "<parameter=note>\ntwo\nlines\n</parameter>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=now>\n</function>\n</tool_call>"
      "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n</function>\n</tool_call>"
      "<tool_call>\n{\"name\": \"hermes\"}\n</tool_call>"
      "<tool_call>\n<function=g>\n<parameter=a>\n1\n</function>\n</tool_call>"
      "<tool_call>\n<function=h>";
  const std::vector<ToolCall> calls = parse_tool_calls(text, ChatTemplate::Qwen3_5);
  ASSERT_EQ(calls.size(), 6u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(calls[0].arguments_json, R"({"city":"New York","days":3,"opts":{"unit":"C"},"note":"two\nlines"})");
  EXPECT_EQ(calls[0].error, "");
  EXPECT_EQ(calls[1].name, "now");
  EXPECT_EQ(calls[1].arguments_json, "{}");
  EXPECT_EQ(calls[2].error, "argument 'a' given twice");
  EXPECT_EQ(calls[3].error, "not <function=NAME>...</function>");
  EXPECT_EQ(calls[4].error, "a <parameter=...> without its closing </parameter>");
  EXPECT_EQ(calls[5].error, "no closing </tool_call>");
  EXPECT_EQ(tool_call_stop(ChatTemplate::Qwen3_5), "</tool_call>");
}

TEST(ToolCalls, DeepSeekFencedJsonBlocks) {
  const std::string text =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```"
      "<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n[1, 2]\n```<｜tool▁call▁end｜>"
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>bad\n```json\n{oops}\n```<｜tool▁call▁end｜>"
      "<｜tool▁call▁begin｜>no separator<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>cut\n```json\n{";
  const std::vector<ToolCall> calls = parse_tool_calls(text, ChatTemplate::DeepSeekR1);
  EXPECT_EQ(parse_tool_calls(text, ChatTemplate::DeepSeekV3).size(), 5u);
  ASSERT_EQ(calls.size(), 5u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(calls[0].arguments_json, R"({"city":"Paris"})");
  EXPECT_EQ(calls[0].error, "");
  EXPECT_EQ(calls[1].error, "arguments are not a JSON object");
  EXPECT_EQ(calls[2].error, "arguments are not valid JSON");
  EXPECT_NE(calls[3].error.find("not TYPE"), std::string::npos) << calls[3].error;
  EXPECT_EQ(calls[4].error, "no closing <｜tool▁call▁end｜>");
  EXPECT_TRUE(parse_tool_calls("plain answer", ChatTemplate::DeepSeekR1).empty());
  EXPECT_EQ(tool_call_stop(ChatTemplate::DeepSeekR1), "<｜tool▁calls▁end｜>");
}

ChatFormat format(ChatTemplate t) {
  ChatFormat f;
  f.chat_template = t;
  if (t == ChatTemplate::Llama3) f.bos_token = "<|begin_of_text|>";
  if (t == ChatTemplate::DeepSeekR1 || t == ChatTemplate::DeepSeekV3) f.bos_token = "<｜begin▁of▁sentence｜>";
  return f;
}

// GLM-4.5 ends a turn with the opener of what follows: a turn stopped at its tool call
// gets <|observation|> and the tool results; one that sampled <|user|> (the end-of-turn
// stop id) gets the user message without a second <|user|>. Reasoning is kept through
// tool rounds and dropped once a new user message comes: that rewrite is refused.
TEST(ChatTranscript, Glm45TurnsEndWithTheNextOpener) {
  ChatTranscript t(format(ChatTemplate::Glm45));
  std::string why;
  t.add_model_turn("\n<think>plan</think>\n<tool_call>f\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
                   "");
  EXPECT_EQ(t.add_observation({{"tool", "2", false, ""}}, &why),
            "<|observation|>\n<tool_response>\n2\n</tool_response><|assistant|>");
  EXPECT_EQ(why, "");
  t.add_model_turn("\n<think>again</think>\n<tool_call>g</tool_call>", "");
  EXPECT_EQ(t.add_observation({{"tool", "3", false, ""}, {"tool", "4", false, ""}}, &why),
            "<|observation|>\n<tool_response>\n3\n</tool_response>\n<tool_response>\n4\n</tool_response><|assistant|>");
  EXPECT_EQ(why, "");
  t.add_model_turn("\n<think>done</think>\nx is 2", "<|user|>");
  EXPECT_EQ(t.add_observation({{"user", "thanks", false, ""}}, &why), "");
  EXPECT_NE(why.find("rewrites the conversation's history"), std::string::npos) << why;

  ChatTranscript plain(format(ChatTemplate::Glm45));
  plain.add_model_turn("\n<think></think>\nhello", "<|user|>");
  EXPECT_EQ(plain.add_observation({{"user", "thanks", false, ""}}, &why), "\nthanks<|assistant|>");
  EXPECT_EQ(why, "");
  plain.add_model_turn("\n<think></think>\ncalling<tool_call>f</tool_call>", "");  // stopped at the call
  EXPECT_EQ(plain.add_observation({{"tool", "r", false, ""}}, &why),
            "<|observation|>\n<tool_response>\nr\n</tool_response><|assistant|>");
  // A turn that sampled <|observation|> (a stop id) has it in the stream already; one that
  // sampled <|user|> before tool results keeps it, and <|observation|> follows.
  ChatTranscript observed(format(ChatTemplate::Glm45));
  observed.add_model_turn("\n<think></think>\n<tool_call>f", "<|observation|>");
  EXPECT_EQ(observed.add_observation({{"tool", "r", false, ""}}, &why), "\n<tool_response>\nr\n</tool_response><|assistant|>");
  observed.add_model_turn("\n<think></think>\ndone", "<|user|>");
  EXPECT_EQ(observed.add_observation({{"tool", "s", false, ""}}, &why),
            "<|observation|>\n<tool_response>\ns\n</tool_response><|assistant|>");
  // Without thinking the generation prompt's empty <think></think> belongs to the turn.
  ChatFormat off = format(ChatTemplate::Glm45);
  off.enable_thinking = false;
  ChatTranscript quiet(off);
  quiet.add_model_turn("\nanswer", "<|user|>");
  EXPECT_EQ(quiet.add_observation({{"user", "more", false, ""}}, &why), "\nmore/nothink<|assistant|>\n<think></think>");
  EXPECT_EQ(why, "");
}

// GLM-4.7: the generation opens with <think>; the model's turn "reasoning</think>answer"
// renders back under it, through tool rounds; without thinking the turn opens with
// </think>. A turn with thinking on but no reasoning renders as "</think>..." where the
// stream holds "<think></think>...": refused as a rewrite.
TEST(ChatTranscript, Glm47TurnsKeepTheirOpenedThinkBlock) {
  ChatTranscript t(format(ChatTemplate::Glm47));
  std::string why;
  t.add_model_turn("plan</think>calling<tool_call>f<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>", "");
  EXPECT_EQ(t.add_observation({{"tool", "2", false, ""}}, &why),
            "<|observation|><tool_response>2</tool_response><|assistant|><think>");
  EXPECT_EQ(why, "");
  ChatFormat off = format(ChatTemplate::Glm47);
  off.enable_thinking = false;
  ChatTranscript quiet(off);
  quiet.add_model_turn("answer", "<|user|>");
  EXPECT_EQ(quiet.add_observation({{"user", "more", false, ""}}, &why), "more<|assistant|></think>");
  EXPECT_EQ(why, "");
  ChatTranscript empty(format(ChatTemplate::Glm47));
  empty.add_model_turn("</think>answer", "<|user|>");
  EXPECT_EQ(empty.add_observation({{"user", "more", false, ""}}, &why), "");
  EXPECT_NE(why.find("rewrites the conversation's history"), std::string::npos) << why;
}

// Qwen3.5: the generation opens with "<think>\n"; after a tool round the turn still follows
// the last user query, so its opened <think> block stays and the episode continues; a new
// user message drops the earlier turns' reasoning (their opened "<think>\n" with it): refused.
TEST(ChatTranscript, Qwen3_5ToolRoundsKeepTheThinkBlock) {
  ChatTranscript t(format(ChatTemplate::Qwen3_5));
  std::string why;
  t.add_model_turn("plan\n</think>\n\n<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n"
                   "</tool_call>",
                   "");
  EXPECT_EQ(t.add_observation({{"tool", "2", false, ""}}, &why),
            "<|im_end|>\n<|im_start|>user\n<tool_response>\n2\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
            "<think>\n");
  EXPECT_EQ(why, "");
  t.add_model_turn("x is 2\n</think>\n\nIt is 2.", "<|im_end|>");
  EXPECT_EQ(t.add_observation({{"user", "thanks", false, ""}}, &why), "");
  EXPECT_NE(why.find("rewrites the conversation's history"), std::string::npos) << why;
}

// DeepSeek-R1 drops a finished turn's reasoning: its generation prompt's <think> is gone
// once the turn exists, so a multi-turn episode is refused at the first observation.
TEST(ChatTranscript, DeepSeekR1CannotContinueAConversation) {
  ChatTranscript t(format(ChatTemplate::DeepSeekR1));
  std::string why;
  t.add_model_turn("reasoning</think>answer", "<｜end▁of▁sentence｜>");
  EXPECT_EQ(t.add_observation({{"tool", "6", false, ""}}, &why), "");
  EXPECT_NE(why.find("rewrites the conversation's history"), std::string::npos) << why;
}

// DeepSeek-V3-0324 renders turns as written: a turn stopped at its calls' end gets the end
// of sentence and the tool outputs, after which the model continues (no Assistant tag);
// a turn that sampled the end of sentence gets the user message alone.
TEST(ChatTranscript, DeepSeekV3ContinuesThroughToolOutputs) {
  ChatTranscript t(format(ChatTemplate::DeepSeekV3));
  std::string why;
  t.add_model_turn("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜>"
                   "<｜tool▁calls▁end｜>",
                   "");
  EXPECT_EQ(t.add_observation({{"tool", "6", false, ""}}, &why),
            "<｜end▁of▁sentence｜><｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>6<｜tool▁output▁end｜><｜tool▁outputs▁end｜>");
  EXPECT_EQ(why, "");
  t.add_model_turn("it is 6", "<｜end▁of▁sentence｜>");
  EXPECT_EQ(t.add_observation({{"user", "thanks", false, ""}}, &why), "<｜User｜>thanks<｜Assistant｜>");
  EXPECT_EQ(why, "");
}

TEST(ChatTranscript, ChatmlDeltaClosesTheTurnAndOpensTheNext) {
  ChatTranscript t(format(ChatTemplate::ChatML));
  std::string why;
  // Stopped by the </tool_call> string: the template's <|im_end|> is the environment's.
  t.add_model_turn("<tool_call>{}</tool_call>", "");
  EXPECT_EQ(t.add_observation({{"tool", "6", false, ""}}, &why),
            "<|im_end|>\n<|im_start|>user\n<tool_response>\n6\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(why, "");
  // Stopped by the <|im_end|> token: only the newline after it is the environment's.
  t.add_model_turn("it is 6", "<|im_end|>");
  EXPECT_EQ(t.add_observation({{"user", "sure?", false, ""}}, &why),
            "\n<|im_start|>user\nsure?<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTranscript, Llama3ToolResultsAreIpythonTurns) {
  ChatTranscript t(format(ChatTemplate::Llama3));
  std::string why;
  t.add_model_turn("{\"name\": \"calculator\", \"parameters\": {}}", "<|eot_id|>");
  EXPECT_EQ(t.add_observation({{"tool", "6", false, ""}}, &why),
            "<|start_header_id|>ipython<|end_header_id|>\n\n6<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(why, "");
}

TEST(ChatTranscript, ATrimmedTurnIsNotARewrite) {
  // Llama 3 trims a turn's whitespace; the stream keeps what was sampled, and goes on.
  ChatTranscript t(format(ChatTemplate::Llama3));
  std::string why;
  t.add_model_turn("  42 \n", "<|eot_id|>");
  EXPECT_EQ(t.add_observation({{"user", "sure?", false, ""}}, &why),
            "<|start_header_id|>user<|end_header_id|>\n\nsure?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(why, "");
  // A second turn that a length limit cut: the template's marker is the environment's.
  t.add_model_turn("{\"name\"", "");
  EXPECT_EQ(t.add_observation({{"tool", "6", false, ""}}, &why).substr(0, 10), "<|eot_id|>");
}

TEST(ChatTranscript, NoTemplateAppendsTheContent) {
  ChatTranscript t(format(ChatTemplate::None));
  std::string why;
  t.add_model_turn("x", "");
  EXPECT_EQ(t.add_observation({{"tool", "6", false, ""}, {"user", "go on", false, ""}}, &why),
            "<tool_response>\n6\n</tool_response>\ngo on\n");
}

TEST(ChatTranscript, AtemplateThatRewritesHistoryIsRefused) {
  // Qwen3 without thinking opens each turn with an empty <think> block, and renders an
  // earlier assistant turn without it: the stream cannot be continued.
  ChatFormat f = format(ChatTemplate::Qwen3);
  f.enable_thinking = false;
  ChatTranscript t(f);
  std::string why;
  t.add_model_turn("call", "<|im_end|>");
  EXPECT_EQ(t.add_observation({{"tool", "6", false, ""}}, &why), "");
  EXPECT_NE(why.find("rewrites the conversation's history"), std::string::npos) << why;
  EXPECT_NE(why.find("<think>"), std::string::npos) << why;
  // With thinking on and no reasoning in the turn, Qwen3 keeps history as written.
  ChatTranscript thinking(format(ChatTemplate::Qwen3));
  thinking.add_model_turn("call", "<|im_end|>");
  EXPECT_NE(thinking.add_observation({{"tool", "6", false, ""}}, &why), "");
  EXPECT_EQ(why, "");
}

TEST(ChatTranscript, SavedAndLoadedItContinuesAsBefore) {
  // A turn cut inside a UTF-8 sequence (raw bytes) and a turn with reasoning survive the
  // round trip byte for byte: the loaded transcript gives the deltas the original gives.
  for (ChatTemplate tpl :
       {ChatTemplate::ChatML, ChatTemplate::Llama3, ChatTemplate::Qwen3, ChatTemplate::Glm45, ChatTemplate::Glm47,
        ChatTemplate::None}) {
    ChatTranscript a(format(tpl));
    std::string why;
    // (GLM-4.7 opened the turn with <think>: the turn closes it, as its model's would; a
    // user message would drop that reasoning, so its observation is the tool's alone.)
    const bool glm47 = tpl == ChatTemplate::Glm47;
    a.add_model_turn(std::string(glm47 ? "r</think>" : "") + "<tool_call>{\"x\": \"\xe2\x82\"}</tool_call>", "");
    std::vector<ChatMessage> observation = {{"tool", "r\xc3\xa9sultat", false, ""}};
    if (!glm47) observation.push_back({"user", "and?", true, "a reason"});
    a.add_observation(observation, &why);
    ASSERT_EQ(why, "");
    a.add_model_turn("half \xf0\x9f", format(tpl).end_of_turn());  // the open turn of a checkpoint waiting for its reply
    ChatTranscript b = ChatTranscript::load(format(tpl), a.save());
    EXPECT_EQ(b.save(), a.save());
    const std::vector<ChatMessage> next = {{"user", "go on", false, ""}};
    std::string why_a, why_b;
    EXPECT_EQ(a.add_observation(next, &why_a), b.add_observation(next, &why_b)) << chat_template_name(tpl);
    EXPECT_EQ(why_a, why_b);
  }
  EXPECT_THROW(ChatTranscript::load(format(ChatTemplate::ChatML), R"({"conversation": 3})"), Error);
  // Saved under one template, it cannot continue under another.
  const std::string chatml = ChatTranscript(format(ChatTemplate::ChatML)).save();
  try {
    ChatTranscript::load(format(ChatTemplate::Llama3), chatml);
    ADD_FAILURE() << "loaded under another template";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.chat_template = \"chatml\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(ChatTranscript::load(format(ChatTemplate::ChatML), "not json"), Error);
}

TEST(EnvProtocol, SnapshotsAndRestores) {
  EnvInfo info;
  EXPECT_EQ(decode_hello(R"({"type":"hello","protocol_version":1,"snapshots":true})", &info), "");
  EXPECT_TRUE(info.snapshots);
  EXPECT_FALSE(info.deterministic);
  EXPECT_NE(decode_hello(R"({"type":"hello","protocol_version":1,"snapshots":"yes"})", &info).find("\"snapshots\""),
            std::string::npos);
  EnvReply r;
  std::string why;
  // Any JSON value but null is a state; it comes back as it was sent.
  ASSERT_EQ(decode_reply(R"({"type":"observation","episode":"e","snapshot":{"board":[1,2],"seed":"x"}})", 100, &r, &why),
            ReplyParse::Ok);
  EXPECT_EQ(r.snapshot, R"({"board":[1,2],"seed":"x"})");
  EXPECT_FALSE(r.restored);
  ASSERT_EQ(decode_reply(R"({"type":"observation","episode":"e"})", 100, &r, &why), ReplyParse::Ok);
  EXPECT_EQ(r.snapshot, "");
  EXPECT_EQ(decode_reply(R"({"type":"observation","episode":"e","snapshot":null})", 100, &r, &why), ReplyParse::BadReply);
  EXPECT_NE(why.find("\"snapshot\" is null"), std::string::npos) << why;
  ASSERT_EQ(decode_reply(R"({"type":"restored","episode":"e"})", 100, &r, &why), ReplyParse::Ok);
  EXPECT_TRUE(r.restored);
  EXPECT_EQ(decode_reply(R"({"type":"restored","episode":"e","done":true})", 100, &r, &why), ReplyParse::BadReply);
  EXPECT_NE(why.find("unknown key \"done\" in a restored reply"), std::string::npos) << why;
  EpisodeStart start;
  start.episode = "9/1/0";
  start.group = 1;
  start.seed = 42;
  start.prompt = "2*3?";
  const nlohmann::json restore = nlohmann::json::parse(encode_restore(start, 2, R"({"board":[1,2]})"));
  EXPECT_EQ(restore.at("type"), "restore");
  EXPECT_EQ(restore.at("episode"), "9/1/0");
  EXPECT_EQ(restore.at("turns"), 2);
  EXPECT_EQ(restore.at("seed"), 42);
  EXPECT_EQ(restore.at("prompt").at("text"), "2*3?");
  EXPECT_EQ(restore.at("snapshot"), nlohmann::json::parse(R"({"board":[1,2]})"));
  EXPECT_EQ(nlohmann::json::parse(encode_reset(start)).at("type"), "reset");
  // A step's reply may open a new context.
  ASSERT_EQ(decode_reply(R"({"type":"observation","episode":"e","messages":[{"role":"user","content":"s"}],)"
                         R"("new_context":true})", 100, &r, &why),
            ReplyParse::Ok);
  EXPECT_TRUE(r.new_context);
  EXPECT_EQ(decode_reply(R"({"type":"observation","episode":"e","new_context":1})", 100, &r, &why), ReplyParse::BadReply);
  EXPECT_NE(why.find("\"new_context\" is not true or false"), std::string::npos) << why;
  r = {};
  ASSERT_EQ(decode_reply(R"({"type":"observation","episode":"e","new_context":true,"resume_context":0})", 100, &r, &why),
            ReplyParse::Ok) << why;
  EXPECT_EQ(r.resume_context, 0);
  r = {};
  EXPECT_EQ(decode_reply(R"({"type":"observation","episode":"e","resume_context":0})", 100, &r, &why), ReplyParse::BadReply);
  EXPECT_NE(why.find("without \"new_context\": true"), std::string::npos) << why;
  EXPECT_EQ(decode_reply(R"({"type":"observation","episode":"e","new_context":true,"resume_context":-1})", 100, &r,
                         &why), ReplyParse::BadReply);
  EXPECT_NE(why.find("not a context's number"), std::string::npos) << why;
}

TEST(EnvProtocol, RepliesAreValidatedFieldByField) {
  EnvReply r;
  std::string why;
  EXPECT_EQ(decode_reply(R"({"type":"observation","episode":"0/1/2","messages":[{"role":"tool","content":"6"}],)"
                         R"("reward":{"correct":1,"format":0.5},"done":false,"metrics":{"calls":1}})",
                         100, &r, &why),
            ReplyParse::Ok);
  EXPECT_EQ(r.episode, "0/1/2");
  EXPECT_DOUBLE_EQ(r.reward, 1.5);
  EXPECT_EQ(r.messages.at(0).content, "6");
  EXPECT_EQ(r.metrics.at("calls"), 1.0);
  // Metric names become metrics.h5 columns: other characters become '_'.
  EXPECT_EQ(decode_reply(R"({"type":"observation","episode":"e","metrics":{"tool calls/turn":2,"":1}})", 100, &r, &why),
            ReplyParse::Ok);
  EXPECT_EQ(r.metrics.at("tool_calls_turn"), 2.0);
  EXPECT_EQ(r.metrics.at("_"), 1.0);
  EXPECT_EQ(decode_reply("not json", 100, &r, &why), ReplyParse::Garbage);
  EXPECT_EQ(decode_reply(R"({"type":"observation"})", 100, &r, &why), ReplyParse::Garbage);
  auto bad = [&](const std::string& line, const std::string& expect) {
    EXPECT_EQ(decode_reply(line, 100, &r, &why), ReplyParse::BadReply) << line;
    EXPECT_NE(why.find(expect), std::string::npos) << why;
    EXPECT_EQ(r.episode, "e");
  };
  bad(R"({"type":"observation","episode":"e","token_ids":[100]})", "not in the vocabulary [0, 100)");
  bad(R"({"type":"observation","episode":"e","reward":"1"})", "not a finite number");
  bad(R"({"type":"observation","episode":"e","done":1})", "\"done\" is not true or false");
  bad(R"({"type":"observation","episode":"e","messages":[{"role":"assistant","content":"x"}]})", "role \"assistant\"");
  bad(R"({"type":"observation","episode":"e","error":{"class":"cosmic"}})", "error class \"cosmic\"");
  bad(R"({"type":"observation","episode":"e","colour":1})", "unknown key \"colour\"");
  bad(R"({"type":"observation","episode":"e","metrics":{"n":1e13}})", "metric \"n\" 10000000000000.0 is beyond");
  bad(R"({"type":"banana","episode":"e"})", "type \"banana\"");
  // Python's json.dumps writes NaN and lone surrogates, which JSON does not allow: the
  // line still names its episode, which alone fails.
  bad(R"({"type":"observation","episode":"e","reward":NaN,"done":true})", "not valid JSON");
  bad(R"({"type":"observation","episode":"e","messages":[{"role":"user","content":"\ud800"}]})", "not valid JSON");
  bad(R"({"type":"error","episode":"e","class":"bogus"})", "an error reply's class is \"bogus\"");
  bad(R"({"type":"error","episode":"e"})", "an error reply's class is \"\"");
  EXPECT_EQ(decode_reply("{\"type\":\"observation\",\"episode\":\"e\",\"done\":true}\r", 100, &r, &why),
            ReplyParse::Ok);  // a CRLF line ending
  EXPECT_EQ(decode_reply(R"({"type":"error","episode":"e","class":"tool","message":"broke"})", 100, &r, &why),
            ReplyParse::Ok);
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.error, EnvError::Tool);
  EnvInfo info;
  EXPECT_EQ(decode_hello(R"({"type":"hello","protocol_version":1,"name":"n","max_concurrent_episodes":4})", &info), "");
  EXPECT_EQ(info.max_concurrent_episodes, 4);
  EXPECT_EQ(decode_hello(R"({"type":"hello","protocol_version":1,"max_concurrent_episodes":9223372036854775807})", &info), "");
  EXPECT_EQ(info.max_concurrent_episodes, kMaxConcurrentEpisodes);  // capped: capacities add up without overflow
  bad(R"({"type":"observation","episode":"e","reward":1e300})", "beyond");
  bad(R"({"type":"observation","episode":"e","reward":{"a":1e300,"b":1e300}})", "beyond");
  EXPECT_NE(decode_hello(R"({"type":"hello","protocol_version":2})", &info).find("slimpi speaks 1"), std::string::npos);
}

TEST(Calculator, IntegerArithmeticAndItsErrors) {
  EXPECT_EQ(calculate("12345 * 6789"), "83810205");
  EXPECT_EQ(calculate("2*(3+4) - -1"), "15");
  EXPECT_EQ(calculate("1/2"), "error: unexpected character at 1");
  EXPECT_EQ(calculate("(1+2"), "error: unexpected end");
  EXPECT_EQ(calculate("9999999999999999999"), "error: overflow");
  EXPECT_EQ(calculate(std::string(201, '1')), "error: longer than 200 characters");
}

// The actions both calculators get, with their tool calls parsed as slimpi parses them.
std::vector<EpisodeAction> scripted_actions(const std::string& episode) {
  std::vector<EpisodeAction> out;
  int64_t turn = 0;
  for (const std::string text :
       {std::string("<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"123*45\"}}</tool_call>"),
        std::string("<tool_call>{\"name\": \"calc\", \"arguments\": {}}</tool_call><tool_call>{bad}</tool_call>"),
        std::string("<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"7 ^ 2\"}}</tool_call>"),
        std::string("<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expr\": \"1\"}}</tool_call>"),
        std::string("  5535 \n")}) {
    EpisodeAction a;
    a.episode = episode;
    a.turn = ++turn;
    a.text = text;
    a.tool_calls = parse_tool_calls(text, ChatTemplate::ChatML);
    a.finish_reason = "stop";
    out.push_back(a);
  }
  return out;
}

std::vector<EnvReply> run_episode(Environment& env, const std::string& label, int64_t max_turns) {
  EpisodeStart s;
  s.episode = "0/0/0";
  s.prompt = "123*45=";
  s.label = label;
  s.max_turns = max_turns;
  env.reset(s);
  std::vector<EnvReply> replies;
  auto wait_one = [&] {
    for (int i = 0; i < 2000; ++i) {
      auto got = env.poll(0.01);
      if (!got.empty()) return got.front();
    }
    ADD_FAILURE() << "no reply";
    return EnvReply();
  };
  wait_one();  // the reset's
  for (const EpisodeAction& a : scripted_actions(s.episode)) {
    env.step(a);
    replies.push_back(wait_one());
    if (replies.back().done || replies.back().truncated) break;
  }
  env.close(s.episode);
  return replies;
}

TEST(Calculator, ThePythonProgramGivesTheInProcessReplies) {
  EnvConfig cfg;
  cfg.name = "command";
  cfg.command = std::string("python3 ") + SLIMPI_SOURCE_DIR + "/inputs/envs/calculator.py";
  for (const auto& [label, max_turns] : {std::pair<std::string, int64_t>{"5535", 8}, {"0", 8}, {"5535", 2}}) {
    CommandEnvironment python(cfg, 300);
    EXPECT_EQ(python.info().name, "calculator");
    EXPECT_TRUE(python.info().deterministic);
    auto native = make_calculator_environment();
    const std::vector<EnvReply> a = run_episode(python, label, max_turns), b = run_episode(*native, label, max_turns);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_EQ(a.size(), max_turns == 2 ? 2u : 5u);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_FALSE(a[i].failed) << a[i].message;
      ASSERT_EQ(a[i].messages.size(), b[i].messages.size()) << i;
      for (size_t m = 0; m < a[i].messages.size(); ++m) {
        EXPECT_EQ(a[i].messages[m].role, b[i].messages[m].role);
        EXPECT_EQ(a[i].messages[m].content, b[i].messages[m].content);
      }
      EXPECT_EQ(a[i].reward, b[i].reward);
      EXPECT_EQ(a[i].done, b[i].done);
      EXPECT_EQ(a[i].truncated, b[i].truncated);
      EXPECT_EQ(a[i].error, b[i].error);
      EXPECT_EQ(a[i].message, b[i].message);
    }
    EXPECT_EQ(b[0].messages[0].content, "5535");
    EXPECT_EQ(b[1].messages[0].content, "error: unknown tool calc");
    if (max_turns == 8) {
      EXPECT_EQ(b[1].messages[1].content, "error: not valid JSON");
      EXPECT_EQ(b[2].messages[0].content, "error: unexpected character at 2");
      EXPECT_EQ(b[3].messages[0].content, "error: arguments need a string \"expression\"");
      EXPECT_EQ(b[4].reward, label == "5535" ? 1.0 : 0.0);
      EXPECT_TRUE(b[4].done);
    } else {
      EXPECT_TRUE(b[1].truncated);
    }
  }
}

TEST(CommandEnvironment, ABrokenCommandEndsTheJobWithTheReason) {
  EnvConfig cfg;
  cfg.name = "command";
  cfg.timeout_s = 5;
  cfg.command = "exit 4";
  try {
    CommandEnvironment env(cfg, 300);
    FAIL() << "started";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exited before its hello (exit status 4)"), std::string::npos) << e.what();
  }
  cfg.command = "echo '{\"type\": \"hello\", \"protocol_version\": 7}'; sleep 5";
  try {
    CommandEnvironment env(cfg, 300);
    FAIL() << "started";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("protocol_version 7 (slimpi speaks 1)"), std::string::npos) << e.what();
  }
}

TEST(CommandEnvironment, ACrashEndsItsEpisodesAndRestartsTheProcessUpToTheLimit) {
  // Answers the hello, then exits at the first reset.
  EnvConfig cfg;
  cfg.name = "command";
  cfg.timeout_s = 5;
  cfg.max_restarts = 1;
  cfg.command = "read l; echo '{\"type\": \"hello\", \"protocol_version\": 1}'; read l; exit 9";
  CommandEnvironment env(cfg, 300);
  EpisodeStart s;
  s.episode = "a";
  env.reset(s);
  std::vector<EnvReply> got;
  for (int i = 0; i < 3000 && got.empty(); ++i) got = env.poll(0.01);  // up to 30 s on a loaded machine
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].failed);
  EXPECT_EQ(got[0].error, EnvError::Infra);
  EXPECT_NE(got[0].message.find("exited (exit status 9)"), std::string::npos) << got[0].message;
  EXPECT_EQ(env.restarts(), 1);
  env.close("a");
  s.episode = "b";
  env.reset(s);
  try {
    for (int i = 0; i < 3000; ++i) env.poll(0.01);  // the crash is seen within ms; 30 s at most
    FAIL() << "no error after the second crash";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rollout.env_max_restarts = 1"), std::string::npos) << e.what();
  }
}

// rollout.env_max_stderr_bytes: a process that floods stderr (20000 lines, ~0.7 MB,
// more than a pipe holds) still answers (its stderr is drained, so it never blocks),
// the log gets its first lines, prefixed, up to the cap and one line saying the rest is
// dropped; a process that dies past its cap has its last lines logged before the restart.
TEST(CommandEnvironment, StderrIsLoggedWithinItsCapAndNeverBlocksTheProcess) {
  EnvConfig cfg;
  cfg.name = "command";
  cfg.timeout_s = 20;
  cfg.max_stderr_bytes = 1000;
  cfg.command =
      "read l; echo '{\"type\": \"hello\", \"protocol_version\": 1}'; read l; "
      "i=0; while [ $i -lt 20000 ]; do echo \"noise line $i of a chatty environment\" >&2; i=$((i+1)); done; "
      "echo '{\"type\": \"observation\", \"episode\": \"a\", \"token_ids\": [5]}'; "
      "read l; echo 'boom: the last words' >&2; exit 3";
  ::testing::internal::CaptureStderr();
  std::vector<EnvReply> got;
  {
    CommandEnvironment env(cfg, 300);
    EpisodeStart s;
    s.episode = "a";
    env.reset(s);
    // (by the clock: a flooding process's stderr wakes poll() at once, many times)
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);  // a loaded machine
    while (got.empty() && std::chrono::steady_clock::now() < deadline) got = env.poll(0.01);
    if (got.size() != 1u || got[0].failed) {
      const std::string log = ::testing::internal::GetCapturedStderr();
      FAIL() << got.size() << " replies to the reset " << (got.empty() ? "" : got[0].message) << "\n" << log;
    }
    EpisodeAction a;
    a.episode = "a";
    a.turn = 1;
    env.step(a);
    std::vector<EnvReply> crash;
    while (crash.empty() && std::chrono::steady_clock::now() < deadline + std::chrono::seconds(30)) crash = env.poll(0.01);
    if (crash.size() != 1u || !crash[0].failed) {
      const std::string log = ::testing::internal::GetCapturedStderr();
      FAIL() << crash.size() << " replies to the step that crashes it\n" << log;
    }
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("[environment process 0 stderr] noise line 0 of a chatty environment"), std::string::npos) << log;
  EXPECT_NE(log.find("more than rollout.env_max_stderr_bytes = 1000 bytes since its start: the rest is dropped"),
            std::string::npos) << log;
  EXPECT_EQ(log.find("noise line 100 "), std::string::npos) << "lines past the cap were logged";
  EXPECT_LT(log.size(), 20000u) << "the log got more than the cap and its messages";
  const size_t last_words = log.find("[environment process 0 stderr, last lines] boom: the last words");
  EXPECT_NE(last_words, std::string::npos) << "the restarted process's stderr since its restart was not logged: " << log;
  EXPECT_LT(last_words, log.find("is killed and restarted")) << "its last words came after the restart";
  size_t tail_lines = 0;  // the kept tail: its last 2 KB, ~40 bytes a line
  for (size_t at = log.find("stderr, last lines]"); at != std::string::npos; at = log.find("stderr, last lines]", at + 1))
    ++tail_lines;
  EXPECT_GE(tail_lines, 2u);
  EXPECT_LE(tail_lines, 2048u / 36 + 1) << "more than the last 2 KB were logged as its last lines";
}

// A command's whole stdout and its wait status.
std::pair<std::string, int> run_to_end(ChildProcess& child) {
  int status = 0;
  EXPECT_TRUE(child.wait_until(std::chrono::steady_clock::now() + std::chrono::seconds(30), &status));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(child.stdout_fd(), buf, sizeof(buf))) > 0;) out.append(buf, size_t(n));
  return {out, status};
}

// The environment a command gets: the rank's, NAME=value entries added or replacing, and
// PREFIX* entries dropping the rank's variables (an agent gets none of the rank's MPI's).
TEST(ChildProcess, ExtraEnvironmentAddsReplacesAndDrops) {
  ::setenv("SLIMPI_TEST_DROP_A", "a", 1);
  ::setenv("SLIMPI_TEST_DROP_B", "b", 1);
  ::setenv("SLIMPI_TEST_KEEP", "k", 1);
  ::setenv("SLIMPI_TEST_OLD", "o", 1);
  ChildProcess child("echo \"$SLIMPI_TEST_DROP_A|$SLIMPI_TEST_DROP_B|$SLIMPI_TEST_KEEP|$SLIMPI_TEST_OLD|$SLIMPI_TEST_NEW\"",
                     false, {"SLIMPI_TEST_NEW=n", "SLIMPI_TEST_DROP*", "SLIMPI_TEST_OLD=replaced", ""});
  const auto [out, status] = run_to_end(child);
  EXPECT_EQ(out, "||k|replaced|n\n");
  EXPECT_EQ(ChildProcess::describe_status(status), "exit status 0");
}

// A command starts with no signal blocked and the default dispositions, whatever the
// rank's thread blocks or ignores (after vfork the rank's mask and dispositions are the
// child's until it resets them).
TEST(ChildProcess, StartsWithDefaultSignalsUnblocked) {
  struct sigaction ignore {}, old_pipe {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &old_pipe);
  sigset_t usr2, old_mask;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &usr2, &old_mask);
  ChildProcess pipe_child("kill -PIPE $$; echo survived");
  ChildProcess usr2_child("kill -USR2 $$; echo survived");
  const auto [pipe_out, pipe_status] = run_to_end(pipe_child);
  const auto [usr2_out, usr2_status] = run_to_end(usr2_child);
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  ::sigaction(SIGPIPE, &old_pipe, nullptr);
  EXPECT_EQ(pipe_out, "");
  EXPECT_TRUE(WIFSIGNALED(pipe_status) && WTERMSIG(pipe_status) == SIGPIPE) << ChildProcess::describe_status(pipe_status);
  EXPECT_EQ(usr2_out, "");
  EXPECT_TRUE(WIFSIGNALED(usr2_status) && WTERMSIG(usr2_status) == SIGUSR2) << ChildProcess::describe_status(usr2_status);
}

// mpirun forwards SIGUSR1 (a clean stop) to the ranks' process groups. A command started in
// the instant before it leaves the rank's group receives that signal too, blocked; it must
// discard it, not die of it once it unblocks. In a process of its own group (so that the
// signals reach no test runner), one thread signals the group every 20 us while 300 commands
// start; none may end by SIGUSR1. (Without the discard some do, at a rate that depends on
// the machine; with it none can.)
TEST(ChildProcess, ASignalToTheRanksGroupAtItsStartIsNotTheCommands) {
  const pid_t helper = ::fork();
  ASSERT_GE(helper, 0);
  if (helper == 0) {
    if (::setpgid(0, 0) != 0) ::_exit(100);  // (never signal the test runner's group)
    ::alarm(120);                            // a hang fails the test (SIGALRM), not ctest's timeout
    struct sigaction note {};
    note.sa_handler = [](int) {};
    ::sigaction(SIGUSR1, &note, nullptr);
    std::atomic<bool> done{false};
    std::thread signaller([&] {
      while (!done) {
        ::kill(0, SIGUSR1);
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    });
    int killed = 0;
    for (int i = 0; i < 300; ++i) {
      ChildProcess child("exit 0");
      int status = 0;
      child.wait_until(std::chrono::steady_clock::now() + std::chrono::seconds(30), &status);
      killed += WIFSIGNALED(status) && WTERMSIG(status) == SIGUSR1;
    }
    done = true;
    signaller.join();
    ::_exit(std::min(killed, 100));
  }
  int status = 0;
  ASSERT_EQ(::waitpid(helper, &status, 0), helper);
  ASSERT_TRUE(WIFEXITED(status)) << ChildProcess::describe_status(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "commands killed by a SIGUSR1 sent to the rank's group";
}

}  // namespace
}  // namespace slimpi
