// ByteTokenizer — text <-> token ids, one id per UTF-8 byte (0..255) plus three
// specials: PAD 256, BOS 257 (starts every prompt), EOS 258 (ends every response).
// Needs model.vocab_size >= 259. Stateless; decode() drops specials.
#pragma once

#include "tokenizer/tokenizer.h"

namespace slimpi {

class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int64_t kPad = 256;
  static constexpr int64_t kBos = 257;
  static constexpr int64_t kEos = 258;
  static constexpr int64_t kVocabSize = 259;

  // BOS + bytes of `prompt`.
  std::vector<int64_t> encode_prompt(const std::string& prompt) const override;
  // bytes of `response` + EOS.
  std::vector<int64_t> encode_response(const std::string& response) const override;
  // BOS + bytes: the template's markers are plain bytes here.
  std::vector<int64_t> encode_chat(const std::string& text) const override { return encode_prompt(text); }
  std::string bos_token() const override { return ""; }
  std::vector<int64_t> encode_text(const std::string& text) const override;  // bytes only
  std::string decode(const std::vector<int64_t>& ids) const override;
  std::vector<int64_t> stop_ids() const override { return {kEos}; }
  int64_t vocab_size() const override { return kVocabSize; }
  std::string describe() const override { return "bytes (ids 0-255, PAD 256, BOS 257, EOS 258)"; }
};

}  // namespace slimpi
