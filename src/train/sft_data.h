// SftData — the supervised set: (prompt, response) pairs from a JSONL file, tokenized
// (encode_prompt(prompt) | encode_response(response), which ends with EOS), and the
// order steps take them in. With a chat template the prompt is a conversation (a
// message list, or a string as one user message): either the response key holds the
// reply, or (no response key on the line) the list's last message is the assistant's
// reply. The prompt is the conversation before the reply rendered with the generation
// prompt; the response is the rest of the whole conversation's rendering up to and with
// the end-of-turn marker (e.g. "reply<|im_end|>"; + EOS where the vocabulary spells the
// marker in pieces); only the response is trained (earlier assistant turns are context).
// Epoch e is a permutation drawn from (seed, e); step s takes global_batch_size
// consecutive entries of that order (crossing into the next epoch as needed); dp rank
// r takes its contiguous share. The order is a pure function of (seed, step), so a
// resumed run sees exactly the samples it would have seen. Immutable after loading.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/epoch_order.h"
#include <slimpi/sample.h>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace slimpi {

class SftData {
 public:
  SftData(const std::string& path, const std::string& input_key, const std::string& response_key,
          int64_t max_seq_len, uint64_t seed, const Tokenizer& tokenizer, const ChatFormat& chat = {});

  size_t size() const { return samples_.size(); }
  // This rank's share of step `step`'s global batch.
  std::vector<Sample> batch(int64_t step, int64_t global_batch_size, int dp_rank, int dp_size) const;
  // Global sample index of entry `k` of the endless epoch-by-epoch order.
  int64_t order(int64_t k) const { return order_.order(k); }

 private:
  std::vector<Sample> samples_;
  EpochOrder order_;
};

}  // namespace slimpi
