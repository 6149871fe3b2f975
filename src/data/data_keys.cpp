// Deck keys of the prompt and SFT data:
// declared beside the code that reads them, collected by deck_keys() (cli/deck_keys.cpp).
#include "deck/key_tables.h"

#include "tokenizer/chat_template.h"

namespace slimpi {

std::vector<KeySpec> data_keys() {
  return {
      // [data]
      string_key("data.path", "", "JSONL training file (relative paths: to the working directory)"),
      string_key("data.input_key", "prompt",
                 "JSONL key of the prompt: its text, or (with data.chat_template) a list of {role, content} messages"),
      string_key("data.response_key", "response", "JSONL key of the response text (SFT)"),
      string_key("data.label_key", "label", "JSONL key of the label the reward compares with (RL)"),
      string_key("data.metadata_key", "", "JSONL key of per-prompt metadata kept with the prompt (\"\" = none)"),
      choice_key("data.chat_template", "none", with_auto(chat_templates().names()),
                 "render prompts as conversations (a string prompt is one user message): chatml (Qwen2/2.5), "
                 "llama3 (Llama 3 Instruct), qwen3 (Qwen3, <think> rules), qwen3_5 (Qwen3.5), glm45 (GLM-4.5 / 4.5-Air), glm47 "
                 "(GLM-4.7 / 4.7-Flash), deepseek_r1 (DeepSeek-R1), deepseek_v3 (DeepSeek-V3-0324); none = the prompt text as it is; auto = the one the tokenizer's model ships when "
                 "slimpi implements it (none when it ships none)"),
      string_key("data.system_prompt", "",
                 "with a chat template: a system message put first in every conversation that has none "
                 "(Qwen2.5-Instruct's default: \"You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\")"),
      bool_key("data.enable_thinking", true,
               "qwen3, qwen3_5, glm45 and glm47 templates: false opens every generation with an empty <think></think> "
               "block (glm47: with </think>; glm45 also ends each user message with /nothink)"),
      bool_key("data.skip_bad_lines", false, "skip malformed prompt lines (counted in rollout/skipped_lines) instead of stopping")
  };
}

}  // namespace slimpi
