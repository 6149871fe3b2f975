// Chat templates: slimpi's built-in chatml / llama3 / qwen3 / glm45 / glm47 / deepseek_r1 /
// deepseek_v3 renderings
// against what transformers' apply_chat_template makes of the models' own Jinja templates
// (Qwen2.5, plain ChatML, Llama 3 Instruct, Qwen3, GLM-4.5 and GLM-4.7 with and without
// thinking, DeepSeek-R1, DeepSeek-V3-0324) on 28 conversations
// (tests/fixtures/chat/make_fixtures.py): text and token ids identical. Then what the
// templates cannot render is refused, and the data paths (RL prompts, SFT pairs) use them.
#include <gtest/gtest.h>
#include <slimpi/error.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/prompt_source.h"
#include "tokenizer/byte_tokenizer.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/hf_tokenizer.h"
#include "train/sft_data.h"

namespace slimpi {
namespace {

namespace fs = std::filesystem;
const fs::path kFixtures = fs::path(SLIMPI_SOURCE_DIR) / "tests/fixtures/chat";

ChatFormat format_of(const nlohmann::json& c, const Tokenizer& tok) {
  ChatFormat f;
  f.chat_template = parse_chat_template(c["chat_template"]);
  f.system_prompt = c["system_prompt"];
  f.enable_thinking = c.value("enable_thinking", true);
  f.bos_token = tok.bos_token();
  return f;
}

TEST(ChatTemplate, RendersAndEncodesAsTransformersDoes) {
  const nlohmann::json cases = nlohmann::json::parse(std::ifstream(kFixtures / "cases.json"))["cases"];
  ASSERT_GE(cases.size(), 530u);
  std::map<std::string, std::shared_ptr<HfTokenizer>> tokenizers;
  std::map<std::string, int> per_setting;
  int failures = 0;
  for (const auto& c : cases) {
    auto& tok = tokenizers[c["tokenizer"]];
    if (!tok) tok = std::make_shared<HfTokenizer>((kFixtures / c["tokenizer"].get<std::string>()).string());
    const ChatFormat f = format_of(c, *tok);
    std::vector<ChatMessage> messages;
    ASSERT_EQ(parse_chat_messages(c["messages"], f.chat_template, &messages), "") << c["messages"].dump();
    const std::string text = render_chat(messages, f, c["add_generation_prompt"]);
    const auto ids = c["ids"].get<std::vector<int64_t>>();
    const bool ok = text == c["text"].get<std::string>() && tok->encode_chat(text) == ids;
    if (!ok && ++failures <= 5)
      ADD_FAILURE() << c["setting"] << " " << c["messages"].dump() << "\n want " << c["text"].dump() << "\n  got "
                    << nlohmann::json(text).dump();
    ++per_setting[c["setting"]];
  }
  EXPECT_EQ(failures, 0);
  // chatml_qwen2.5, chatml_plain, llama3, qwen3, qwen3_no_thinking, qwen3_5, qwen3_5_no_thinking, glm45,
  // glm45_no_thinking, glm47, glm47_no_thinking, deepseek_r1, deepseek_v3
  EXPECT_EQ(per_setting.size(), 13u);
  EXPECT_EQ(per_setting["qwen3_5"], 52);
  EXPECT_EQ(per_setting["qwen3_5_no_thinking"], 52);
  EXPECT_EQ(per_setting["deepseek_v3"], 50);
  EXPECT_EQ(per_setting["glm45"], 56);
  EXPECT_EQ(per_setting["glm47"], 56);
  EXPECT_EQ(per_setting["deepseek_r1"], 50);
}

TEST(ChatTemplate, StripsUnicodeWhitespaceAsPython) {
  EXPECT_EQ(strip_unicode_whitespace(" \t\n a b \r\x0b\x0c"), "a b");
  EXPECT_EQ(strip_unicode_whitespace("\u3000\u00a0x\u2003\u2028"), "x");
  EXPECT_EQ(strip_unicode_whitespace("\u200bx"), "\u200bx");  // zero-width space is not whitespace
  EXPECT_EQ(strip_unicode_whitespace(" \u3000 "), "");
  EXPECT_EQ(strip_unicode_whitespace("机器 学习"), "机器 学习");
}

TEST(ChatTemplate, RecognisesShippedTemplatesByTheirMarkers) {
  // Fragments of the models' own Jinja templates (Qwen2.5, Qwen3, Llama 3 Instruct).
  EXPECT_EQ(recognise_chat_template("{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'}}"),
            ChatTemplate::ChatML);
  EXPECT_EQ(recognise_chat_template("{%- if enable_thinking is defined %}<think>\\n\\n</think>{%- endif %}"
                                    "{{- '<|im_start|>assistant\\n' }}"),
            ChatTemplate::Qwen3);
  // Qwen3-2507 Thinking's (Qwen3-Next-80B-A3B-Thinking): <think> always opens the generation, no switch.
  EXPECT_EQ(recognise_chat_template("{{- '<|im_start|>' + message.role }}{{- '<|im_start|>assistant\\n<think>\\n' }}"),
            std::nullopt);
  // Qwen3.5's (Qwen/Qwen3.5-27B): XML tool calls, <think> opening the generation unless
  // thinking is off; its 0.8B / 2B variant opens it only when asked: not it.
  const std::string qwen3_5 =
      "{{- '<|im_start|>' + message.role }}{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
      "{{- '<parameter=' + args_name + '>\\n' }}{{- '<|im_start|>assistant\\n' }}";
  EXPECT_EQ(recognise_chat_template(qwen3_5 + "{%- if enable_thinking is defined and enable_thinking is false %}"
                                    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- else %}{{- '<think>\\n' }}"),
            ChatTemplate::Qwen3_5);
  EXPECT_EQ(recognise_chat_template(qwen3_5 + "{%- if enable_thinking is defined and enable_thinking is true %}"
                                    "{{- '<think>\\n' }}{%- else %}{{- '<think>\\n\\n</think>\\n\\n' }}"),
            std::nullopt);
  EXPECT_EQ(recognise_chat_template("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
                                    " + message['content'] | trim + '<|eot_id|>' }}"),
            ChatTemplate::Llama3);
  // GLM-4.5's (zai-org/GLM-4.5) and DeepSeek-R1's (deepseek-ai/DeepSeek-R1) markers; GLM-4.7
  // writes <think> without the newline and DeepSeek-V3 opens no <think>: not these.
  EXPECT_EQ(recognise_chat_template("[gMASK]<sop>\n{%- if add_generation_prompt -%}<|assistant|>{{- '\\n<think></think>' "
                                    "if (enable_thinking is defined and not enable_thinking) else '' -}}{% endif %}"
                                    "{{- '<|observation|>' }}"),
            ChatTemplate::Glm45);
  EXPECT_EQ(recognise_chat_template("[gMASK]<sop>{{ '<think></think>' }}<|assistant|><think>{{- '<|observation|>' }}"),
            std::nullopt);
  // GLM-4.7's (zai-org/GLM-4.7-Flash), and GLM-5's, which sets a reasoning effort: not it.
  const std::string glm47 =
      "[gMASK]<sop>{%- if ((clear_thinking is defined and not clear_thinking) or loop.index0 > ns.last_user_index) "
      "-%}{{- '<|observation|>' }}<|assistant|>{{- '</think>' if (enable_thinking is defined and not enable_thinking) "
      "else '<think>' -}}";
  EXPECT_EQ(recognise_chat_template(glm47), ChatTemplate::Glm47);
  EXPECT_EQ(recognise_chat_template("{%- set effective_reasoning_effort = reasoning_effort -%}" + glm47), std::nullopt);
  EXPECT_EQ(recognise_chat_template("{{'<｜User｜>' + message['content']}}{{'<｜Assistant｜><think>\\n'}}"),
            ChatTemplate::DeepSeekR1);
  // DeepSeek-V3-0324's joins its system messages (is_first_sp); V3's first template is neither.
  EXPECT_EQ(recognise_chat_template("{% set ns = namespace(is_first_sp=true) %}{{'<｜User｜>' + message['content']}}"
                                    "{{'<｜Assistant｜>'}}"),
            ChatTemplate::DeepSeekV3);
  EXPECT_EQ(recognise_chat_template("{{'<｜User｜>' + message['content']}}{{'<｜Assistant｜>'}}"), std::nullopt);
  EXPECT_EQ(recognise_chat_template("{% set ns = namespace(is_first_sp=true) %}{{'<｜User｜>' + message['content']}}"
                                    "{% set content = content.split('</think>')[-1] %}{{'<｜Assistant｜>'}}"),
            std::nullopt);  // an R1-style template that drops reasoning
  EXPECT_EQ(recognise_chat_template("{% for m in messages %}### {{ m.role }}: {{ m.content }}{% endfor %}"),
            std::nullopt);
  EXPECT_EQ(recognise_chat_template(""), std::nullopt);
}

TEST(ChatTemplate, RefusesWhatItCannotRender) {
  std::vector<ChatMessage> m;
  auto problem = [&](const char* json, ChatTemplate t) { return parse_chat_messages(nlohmann::json::parse(json), t, &m); };
  EXPECT_EQ(problem(R"("plain")", ChatTemplate::ChatML), "");
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].role, "user");
  EXPECT_NE(problem("[]", ChatTemplate::ChatML).find("empty"), std::string::npos);
  EXPECT_NE(problem("3", ChatTemplate::ChatML).find("string or a list"), std::string::npos);
  EXPECT_NE(problem(R"([{"role": "user"}])", ChatTemplate::ChatML).find("both 'role' and 'content'"),
            std::string::npos);
  EXPECT_NE(problem(R"([{"role": "user", "content": [{"type": "image"}]}])", ChatTemplate::Qwen3).find("multimodal"),
            std::string::npos);
  EXPECT_NE(problem(R"([{"role": "developer", "content": "x"}])", ChatTemplate::ChatML).find("role 'developer'"),
            std::string::npos);
  EXPECT_NE(problem(R"([{"role": "tool", "content": "x"}])", ChatTemplate::Llama3).find("role 'tool'"),
            std::string::npos);
  EXPECT_EQ(problem(R"([{"role": "tool", "content": "x"}])", ChatTemplate::Qwen3), "");
  EXPECT_NE(problem(R"([{"role": "assistant", "content": "", "tool_calls": []}])", ChatTemplate::Qwen3)
                .find("key 'tool_calls'"),
            std::string::npos);
  EXPECT_NE(problem(R"([{"role": "assistant", "content": "a", "reasoning_content": "r"}])", ChatTemplate::ChatML)
                .find("reasoning_content"),
            std::string::npos);
  EXPECT_NE(problem(R"([{"role": "user", "content": "a", "reasoning_content": "r"}])", ChatTemplate::Qwen3)
                .find("assistant messages"),
            std::string::npos);
  // What Qwen3.5's template raises on: a late system message, no user query.
  EXPECT_NE(problem(R"([{"role": "user", "content": "a"}, {"role": "system", "content": "s"}])", ChatTemplate::Qwen3_5)
                .find("System message must be at the beginning"),
            std::string::npos);
  EXPECT_NE(problem(R"([{"role": "system", "content": "s"}])", ChatTemplate::Qwen3_5).find("No user query"),
            std::string::npos);
  EXPECT_NE(problem(R"([{"role": "user", "content": " <tool_response>x</tool_response>\n"}])", ChatTemplate::Qwen3_5)
                .find("No user query"),
            std::string::npos);
  EXPECT_EQ(problem(R"([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}])", ChatTemplate::Qwen3_5),
            "");
  EXPECT_THROW(parse_chat_template("chatml2"), Error);
}

TEST(ChatTemplate, SystemPromptGoesFirstOnlyWhenThereIsNone) {
  ChatFormat f;
  f.chat_template = ChatTemplate::ChatML;
  f.system_prompt = "S";
  const std::string with_default = render_chat({{"user", "hi", false, ""}}, f, true);
  EXPECT_EQ(with_default, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  const std::string own = render_chat({{"system", "mine", false, ""}, {"user", "hi", false, ""}}, f, false);
  EXPECT_EQ(own, "<|im_start|>system\nmine<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n");
}

std::string write_lines(const std::string& name, const std::vector<std::string>& lines) {
  const std::string path = (fs::temp_directory_path() / name).string();
  std::ofstream out(path);
  for (const auto& l : lines) out << l << "\n";
  return path;
}

// RL prompts: a message list or a string is rendered with the generation prompt and
// encoded without the post-processor's specials; a list without a template is a bad line.
TEST(ChatTemplate, PromptSourceRendersConversations) {
  auto tok = std::make_shared<HfTokenizer>((kFixtures / "qwen_chat").string());
  const std::string path = write_lines(
      "slimpi_chat_prompts.jsonl",
      {R"({"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "2+2?"}], "label": "4"})",
       R"({"prompt": "3+3?", "label": "6"})"});
  PromptSourceSpec spec;
  spec.path = path;
  spec.tokenizer = tok;
  spec.chat.chat_template = ChatTemplate::Qwen3;
  spec.chat.enable_thinking = false;
  PromptSource source(spec, 1);
  ASSERT_EQ(source.size(), 2u);
  const Prompt& first = source.records()[0];
  EXPECT_TRUE(first.chat);
  EXPECT_EQ(first.text, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
                        "<think>\n\n</think>\n\n");
  EXPECT_EQ(prompt_token_ids(*tok, first), tok->encode_chat(first.text));
  EXPECT_EQ(source.records()[1].text,
            "<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");

  spec.chat = ChatFormat();  // no template: the message list is a bad line
  try {
    PromptSource refused(spec, 1);
    ADD_FAILURE() << "a message list without a chat template was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(":1: key 'prompt'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("data.chat_template"), std::string::npos) << e.what();
  }
  spec.skip_bad_lines = true;
  PromptSource skipped(spec, 1);
  EXPECT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped.n_skipped_lines(), 1);
}

// SFT: the reply (a response key or the conversation's last assistant message) is the
// trained response: the whole rendering minus the context's generation prompt.
TEST(ChatTemplate, SftSplitsTheReplyOffTheConversation) {
  HfTokenizer tok((kFixtures / "qwen_chat").string());
  ChatFormat chat;
  chat.chat_template = ChatTemplate::ChatML;
  chat.system_prompt = "S";
  const std::string path = write_lines(
      "slimpi_chat_sft.jsonl",
      {R"({"prompt": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})",
       R"({"prompt": "hi", "response": "hello"})"});
  SftData data(path, "prompt", "response", 4096, 1, tok, chat);
  ASSERT_EQ(data.size(), 2u);
  const std::vector<Sample> batch = data.batch(0, 2, 0, 1);
  const std::string prompt = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
  for (const Sample& s : batch) {
    const std::vector<int64_t> want_prompt = tok.encode_chat(prompt);
    const std::vector<int64_t> want_reply = tok.encode_text("hello<|im_end|>");  // up to and with the marker
    ASSERT_EQ(s.prompt_length, static_cast<int64_t>(want_prompt.size()));
    EXPECT_EQ(std::vector<int64_t>(s.tokens.begin(), s.tokens.begin() + s.prompt_length), want_prompt);
    EXPECT_EQ(std::vector<int64_t>(s.tokens.begin() + s.prompt_length, s.tokens.end()), want_reply);
  }
  // qwen3: the last turn's reply opens with an empty think block (as Qwen3's template
  // renders the final assistant turn); llama3: header, stripped reply, <|eot_id|>.
  chat.chat_template = ChatTemplate::Qwen3;
  chat.system_prompt = "";
  SftData q3(write_lines("slimpi_chat_sft_q3.jsonl",
                         {R"({"prompt": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "reasoning_content": "think"}]})"}),
             "prompt", "response", 4096, 1, tok, chat);
  const Sample q = q3.batch(0, 1, 0, 1)[0];
  EXPECT_EQ(tok.decode(std::vector<int64_t>(q.tokens.begin() + q.prompt_length, q.tokens.end())),
            "<think>\nthink\n</think>\n\nyo");  // decode drops the special <|im_end|>
  EXPECT_EQ(q.tokens.back(), tok.encode_text("<|im_end|>").at(0));
  HfTokenizer llama((kFixtures / "llama3_chat").string());
  chat.chat_template = ChatTemplate::Llama3;
  chat.bos_token = llama.bos_token();
  SftData l3(write_lines("slimpi_chat_sft_l3.jsonl", {R"({"prompt": " hi ", "response": " yo \n"})"}), "prompt",
             "response", 4096, 1, llama, chat);
  const Sample l = l3.batch(0, 1, 0, 1)[0];
  EXPECT_EQ(std::vector<int64_t>(l.tokens.begin() + l.prompt_length, l.tokens.end()), llama.encode_text("yo<|eot_id|>"));
  EXPECT_EQ(std::vector<int64_t>(l.tokens.begin(), l.tokens.begin() + l.prompt_length),
            llama.encode_chat("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                              "<|start_header_id|>assistant<|end_header_id|>\n\n"));
  // Two assistant turns in a row: qwen3 renders the first with a think block when it is
  // the last of the context but without one inside the whole conversation: refused.
  chat.chat_template = ChatTemplate::Qwen3;
  try {
    SftData bad(write_lines("slimpi_chat_sft_q3_bad.jsonl",
                            {R"({"prompt": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "assistant", "content": "c"}]})"}),
                "prompt", "response", 4096, 1, tok, chat);
    ADD_FAILURE() << "a context the template renders two ways was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("renders this conversation's context differently"), std::string::npos)
        << e.what();
  }
  // glm45 closes no turn in its text: the reply is trained up to the opener that ends it,
  // <|user|> (a stop id), after the template's think block.
  HfTokenizer glm((kFixtures / "glm_chat").string());
  chat.chat_template = ChatTemplate::Glm45;
  chat.bos_token = "";
  SftData g(write_lines("slimpi_chat_sft_glm.jsonl", {R"({"prompt": "hi", "response": " yo "})"}), "prompt",
            "response", 4096, 1, glm, chat);
  const Sample gs = g.batch(0, 1, 0, 1)[0];
  EXPECT_EQ(std::vector<int64_t>(gs.tokens.begin(), gs.tokens.begin() + gs.prompt_length),
            glm.encode_chat("[gMASK]<sop><|user|>\nhi<|assistant|>"));
  EXPECT_EQ(std::vector<int64_t>(gs.tokens.begin() + gs.prompt_length, gs.tokens.end()),
            glm.encode_text("\n<think></think>\nyo<|user|>"));
  // glm47 without thinking: the generation opens with </think>, the reply follows it.
  chat.chat_template = ChatTemplate::Glm47;
  chat.enable_thinking = false;
  SftData g47(write_lines("slimpi_chat_sft_glm47.jsonl", {R"({"prompt": "hi", "response": " yo "})"}), "prompt",
              "response", 4096, 1, glm, chat);
  const Sample g47s = g47.batch(0, 1, 0, 1)[0];
  EXPECT_EQ(std::vector<int64_t>(g47s.tokens.begin(), g47s.tokens.begin() + g47s.prompt_length),
            glm.encode_chat("[gMASK]<sop><|user|>hi<|assistant|></think>"));
  EXPECT_EQ(std::vector<int64_t>(g47s.tokens.begin() + g47s.prompt_length, g47s.tokens.end()),
            glm.encode_text("yo<|user|>"));
  chat.enable_thinking = true;
  // deepseek_r1 opens the generation with <think> but drops it from a finished turn: its
  // context renders two ways, so SFT under it is refused.
  HfTokenizer ds((kFixtures / "deepseek_chat").string());
  chat.chat_template = ChatTemplate::DeepSeekR1;
  chat.bos_token = ds.bos_token();
  try {
    SftData bad(write_lines("slimpi_chat_sft_r1.jsonl", {R"({"prompt": "hi", "response": "yo"})"}), "prompt",
                "response", 4096, 1, ds, chat);
    ADD_FAILURE() << "deepseek_r1 SFT was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("renders this conversation's context differently"), std::string::npos)
        << e.what();
  }
  // deepseek_v3 renders a turn as written: the reply and its end of sentence.
  chat.chat_template = ChatTemplate::DeepSeekV3;
  SftData v3(write_lines("slimpi_chat_sft_v3.jsonl", {R"({"prompt": "hi", "response": "yo"})"}), "prompt", "response",
             4096, 1, ds, chat);
  const Sample v3s = v3.batch(0, 1, 0, 1)[0];
  EXPECT_EQ(std::vector<int64_t>(v3s.tokens.begin(), v3s.tokens.begin() + v3s.prompt_length),
            ds.encode_chat("<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜>"));
  EXPECT_EQ(std::vector<int64_t>(v3s.tokens.begin() + v3s.prompt_length, v3s.tokens.end()),
            ds.encode_text("yo<｜end▁of▁sentence｜>"));
  // The byte vocabulary spells the marker in bytes: the reply ends with its EOS too.
  ByteTokenizer bytes;
  chat.chat_template = ChatTemplate::ChatML;
  chat.bos_token = "";
  SftData b(write_lines("slimpi_chat_sft_bytes.jsonl", {R"({"prompt": "hi", "response": "yo"})"}), "prompt",
            "response", 4096, 1, bytes, chat);
  const Sample bs = b.batch(0, 1, 0, 1)[0];
  EXPECT_EQ(bs.tokens.front(), ByteTokenizer::kBos);
  EXPECT_EQ(bs.tokens.back(), ByteTokenizer::kEos);
  EXPECT_EQ(bytes.decode(std::vector<int64_t>(bs.tokens.begin() + bs.prompt_length, bs.tokens.end())), "yo<|im_end|>");
  chat.chat_template = ChatTemplate::ChatML;
  const std::string no_reply = write_lines("slimpi_chat_sft_bad.jsonl", {R"({"prompt": [{"role": "user", "content": "hi"}]})"});
  try {
    SftData bad(no_reply, "prompt", "response", 4096, 1, tok, chat);
    ADD_FAILURE() << "a conversation without a reply was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(":1: an SFT conversation without a response key"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace slimpi
