// HfTokenizer — a Hugging Face tokenizer directory as a slimpi Tokenizer: tokenizer.json
// (byte-level BPE, tokenizer/bpe_tokenizer.h) for the ids; prompts get the
// post-processor's specials (Llama 3's BOS; none for Qwen); the ids that end a response
// are generation_config.json's eos_token_id (a number or a list) and tokenizer_config.json's
// eos_token, whichever are present (at least one must be); an SFT response ends with the
// first of them. decode() drops special tokens, as the reward and stop strings want.
// tokenizer_config.json's bos_token and pad_token, when they name a token, are kept for
// the export's config files (and the bos text for chat templates that write it). The
// model's own chat template (tokenizer_config.json's chat_template: a string, or a list
// of {name, template} of which "default" or the first; else chat_template.jinja) is
// kept as text: slimpi renders its built-in templates (tokenizer/chat_template.h) and
// says when the shipped one is another or unused.
#pragma once

#include <filesystem>
#include <optional>

#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace slimpi {

class HfTokenizer : public Tokenizer {
 public:
  // dir: a directory with tokenizer.json (or the tokenizer.json file itself).
  explicit HfTokenizer(const std::string& dir);
  std::vector<int64_t> encode_prompt(const std::string& text) const override { return bpe_.encode(text, true); }
  std::vector<int64_t> encode_response(const std::string& text) const override;
  std::vector<int64_t> encode_chat(const std::string& text) const override { return bpe_.encode(text, false); }
  std::vector<int64_t> encode_text(const std::string& text) const override { return bpe_.encode(text, false); }
  std::string bos_token() const override { return bos_ ? bos_text_ : std::string(); }
  std::string decode(const std::vector<int64_t>& ids) const override { return bpe_.decode(ids, true); }
  std::vector<int64_t> stop_ids() const override { return eos_; }
  int64_t vocab_size() const override { return bpe_.vocab_size(); }
  std::string describe() const override;
  ShippedTemplate shipped_chat_template() const override { return chat_template_; }
  const BpeTokenizer& bpe() const { return bpe_; }
  const std::filesystem::path& directory() const { return dir_; }  // the one holding tokenizer.json
  std::optional<int64_t> bos_id() const { return bos_; }
  std::optional<int64_t> pad_id() const { return pad_; }

 private:
  BpeTokenizer bpe_;
  std::filesystem::path dir_;
  std::vector<int64_t> eos_;
  std::optional<int64_t> bos_, pad_;
  std::string bos_text_;
  ShippedTemplate chat_template_;
};

}  // namespace slimpi
