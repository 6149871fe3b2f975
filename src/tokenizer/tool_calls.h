// Tool calls in a model's turn — the calls a chat model writes in its text, parsed the
// way its family writes them, for the environment (env/environment.h), which gets them
// beside the raw text:
//   chatml, qwen3, none  <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> blocks
//                        (Qwen2.5 / Qwen3, Hermes style), any number per turn
//   llama3               the whole turn is one JSON object {"name": ..., "parameters": {...}}
//                        (Llama 3.1's JSON tool calling; "arguments" is accepted too)
//   glm45, glm47         <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...
//                        </tool_call> blocks (GLM-4.5; GLM-4.7's form is the same without
//                        the newlines); a value that parses as JSON is that value, else a string
//   qwen3_5              <tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n...</function>
//                        \n</tool_call> blocks (Qwen3.5, Qwen3-Coder's XML form); a value that
//                        parses as JSON is that value, else a string
//   deepseek_r1, _v3     <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
//                        <｜tool▁call▁end｜> blocks (DeepSeek-V3 / R1), any number per turn
// A block that is malformed (not valid JSON, no string "name", ...) is still returned, with
// `error` saying why and `raw` its text: the environment decides what a malformed call
// costs. Pure functions.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/chat_template.h"

namespace slimpi {

struct ToolCall {
  std::string name;            // "" when the call could not be parsed
  std::string arguments_json;  // a JSON object's text ("{}" when the call gave none)
  std::string raw;             // the call's text as the model wrote it
  std::string error;           // "" = parsed
};

std::vector<ToolCall> parse_tool_calls(const std::string& text, ChatTemplate t);

// The stop string that ends a turn at its tool call, for the templates whose calls are
// closed by a marker ("</tool_call>"; deepseek_r1 and _v3: "<｜tool▁calls▁end｜>"); "" for llama3
// (its calls end the turn).
std::string tool_call_stop(ChatTemplate t);

}  // namespace slimpi
