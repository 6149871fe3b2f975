#include "tokenizer/byte_tokenizer.h"

namespace slimpi {

std::vector<int64_t> ByteTokenizer::encode_prompt(const std::string& prompt) const {
  std::vector<int64_t> ids{kBos};
  for (unsigned char c : prompt) ids.push_back(c);
  return ids;
}

std::vector<int64_t> ByteTokenizer::encode_text(const std::string& text) const {
  std::vector<int64_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::vector<int64_t> ByteTokenizer::encode_response(const std::string& response) const {
  std::vector<int64_t> ids = encode_text(response);
  ids.push_back(kEos);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids)
    if (id >= 0 && id < 256) out.push_back(static_cast<char>(id));
  return out;
}

}  // namespace slimpi
