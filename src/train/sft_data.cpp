#include "train/sft_data.h"

#include <slimpi/error.h>

#include "buffer/jsonl_file.h"
#include "tokenizer/byte_tokenizer.h"

namespace slimpi {

SftData::SftData(const std::string& path, const std::string& input_key, const std::string& response_key,
                 int64_t max_seq_len, uint64_t seed, const Tokenizer& tok)
    : order_(0, seed) {
  for (const auto& r : read_jsonl(path, {input_key, response_key})) {
    Sample s;
    s.tokens = tok.encode_prompt(r.fields[0]);
    s.prompt_length = static_cast<int64_t>(s.tokens.size());
    std::vector<int64_t> response = tok.encode_response(r.fields[1]);
    s.tokens.insert(s.tokens.end(), response.begin(), response.end());
    if (int64_t(s.tokens.size()) > max_seq_len)
      SLIMPI_FAIL_ALL("{}:{}: prompt + response is {} tokens, longer than model.max_seq_len = {}", path, r.line,
                      s.tokens.size(), max_seq_len);
    samples_.push_back(std::move(s));
  }
  order_ = EpochOrder(static_cast<int64_t>(samples_.size()), seed);
}

std::vector<Sample> SftData::batch(int64_t step, int64_t global_batch_size, int dp_rank, int dp_size) const {
  const int64_t first = step * global_batch_size;
  const int64_t lo = global_batch_size * dp_rank / dp_size, hi = global_batch_size * (dp_rank + 1) / dp_size;
  std::vector<Sample> out;
  for (int64_t k = lo; k < hi; ++k) out.push_back(samples_[order(first + k)]);
  return out;
}

}  // namespace slimpi
