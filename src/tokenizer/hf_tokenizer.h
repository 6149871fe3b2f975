// HfTokenizer — a Hugging Face tokenizer directory as a slimpi Tokenizer: tokenizer.json
// (byte-level BPE, tokenizer/bpe_tokenizer.h) for the ids; prompts get the
// post-processor's specials (Llama 3's BOS; none for Qwen); the ids that end a response
// are generation_config.json's eos_token_id (a number or a list) and tokenizer_config.json's
// eos_token, whichever are present (at least one must be); an SFT response ends with the
// first of them. decode() drops special tokens, as the reward and stop strings want.
#pragma once

#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace slimpi {

class HfTokenizer : public Tokenizer {
 public:
  // dir: a directory with tokenizer.json (or the tokenizer.json file itself).
  explicit HfTokenizer(const std::string& dir);
  std::vector<int64_t> encode_prompt(const std::string& text) const override { return bpe_.encode(text, true); }
  std::vector<int64_t> encode_response(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override { return bpe_.decode(ids, true); }
  std::vector<int64_t> stop_ids() const override { return eos_; }
  int64_t vocab_size() const override { return bpe_.vocab_size(); }
  std::string describe() const override;
  const BpeTokenizer& bpe() const { return bpe_; }

 private:
  BpeTokenizer bpe_;
  std::vector<int64_t> eos_;
};

}  // namespace slimpi
