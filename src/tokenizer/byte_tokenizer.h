// ByteTokenizer — text <-> token ids, one id per UTF-8 byte (0..255) plus three
// specials: PAD 256, BOS 257 (starts every prompt), EOS 258 (ends every response).
// Needs model.vocab_size >= 259. Stateless; decode() drops specials.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slimpi {

class ByteTokenizer {
 public:
  static constexpr int64_t kPad = 256;
  static constexpr int64_t kBos = 257;
  static constexpr int64_t kEos = 258;
  static constexpr int64_t kVocabSize = 259;

  // BOS + bytes of `prompt`.
  std::vector<int64_t> encode_prompt(const std::string& prompt) const;
  // bytes of `response` + EOS.
  std::vector<int64_t> encode_response(const std::string& response) const;
  std::string decode(const std::vector<int64_t>& ids) const;
};

}  // namespace slimpi
