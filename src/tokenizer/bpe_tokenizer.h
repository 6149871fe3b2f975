// BpeTokenizer — a Hugging Face tokenizer.json with a byte-level BPE model (GPT-2,
// Llama 3, Qwen2/2.5/3, DeepSeek style), encoding and decoding as the `tokenizers`
// library does (tested id for id against it: tests/fixtures/tokenizers/).
//
// encode(text):
//   1. split out added tokens (leftmost, longest match; special or not): each is one id;
//   2. the rest: normalizer (none, NFC via utf8proc, or a Sequence of them), then the
//      pre-tokenizers in order — Split(regex, Isolated) through PCRE2 with Unicode
//      properties (matches and the gaps between them become pieces), ByteLevel (bytes
//      mapped to GPT-2's printable characters; with use_regex it first splits by GPT-2's
//      own regex; add_prefix_space prepends a space);
//   3. each piece through BPE: its characters are the initial symbols, and the adjacent
//      pair of lowest merge rank (leftmost on ties) merges until none is in the merge
//      table (a heap of candidate pairs: O(n log n) in the piece's length); with
//      ignore_merges a piece that is itself in the vocabulary is one id. Pieces are
//      cached (a word is encoded once);
//   4. with_specials: the post-processor's template for one sequence (Llama 3's BOS).
// decode(ids): added tokens as their text (or dropped: skip_special), the rest joined and
// mapped back from byte-level characters to bytes (invalid UTF-8 left as bytes).
// Anything in the file this cannot honour (another model type, a normalizer, a
// pre-tokenizer or split behaviour it lacks, lstrip/rstrip added tokens, byte fallback,
// dropout) is an error at load naming it, never a silent difference.
// Immutable after load; encode() is const but not thread-safe (the piece cache).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace slimpi {

class BpeTokenizer {
 public:
  // path: a tokenizer.json file or a directory holding one.
  explicit BpeTokenizer(const std::string& path);
  ~BpeTokenizer();
  BpeTokenizer(BpeTokenizer&&) noexcept;

  std::vector<int64_t> encode(std::string_view text, bool with_specials = false) const;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = false) const;

  int64_t vocab_size() const;                     // largest id + 1
  int64_t token_id(const std::string& token) const;  // -1 if absent
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace slimpi
