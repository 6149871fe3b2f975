// Tokenizer — text <-> token ids for everything a run encodes or decodes: prompts (with
// the vocabulary's start specials), SFT responses (+ EOS), responses decoded for rewards
// and stop strings, and the ids that end a generation. Two vocabularies:
//   ByteTokenizer  slimpi's own: bytes 0-255, PAD 256, BOS 257, EOS 258 (the default)
//   HfTokenizer    a Hugging Face tokenizer.json (byte-level BPE, tokenizer/bpe_tokenizer.h)
//                  with its EOS ids from generation_config.json / tokenizer_config.json
// make_tokenizer(deck) picks tokenizer.path: "bytes", or a directory / tokenizer.json.
// The deck loader resolves "" (the default) to model.init_from's directory when that
// holds a tokenizer.json, else to "bytes" (config/hf_config.h), so the resolved deck and
// every checkpoint record which vocabulary the run uses.
// Immutable once made; shared by pointer; not for concurrent use from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace slimpi {

class Deck;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int64_t> encode_prompt(const std::string& text) const = 0;
  virtual std::vector<int64_t> encode_response(const std::string& text) const = 0;  // ends with EOS
  // A chat template's rendering (tokenizer/chat_template.h): the template writes the
  // special tokens itself, so an HF vocabulary adds none (transformers'
  // apply_chat_template does the same); the byte vocabulary starts it with its BOS.
  virtual std::vector<int64_t> encode_chat(const std::string& text) const = 0;
  virtual std::vector<int64_t> encode_text(const std::string& text) const = 0;  // no special ids added
  virtual std::string bos_token() const = 0;  // the BOS token's text ("" = none written in text)
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;             // special tokens dropped
  virtual std::vector<int64_t> stop_ids() const = 0;  // a response ends at any of these
  virtual int64_t vocab_size() const = 0;             // the model needs at least this many ids
  virtual std::string describe() const = 0;           // one line for the log
  // The chat template the vocabulary's model ships (Jinja text) and where it was read
  // (tokenizer_config.json's chat_template, or chat_template.jinja); "" = none.
  struct ShippedTemplate {
    std::string text;
    std::string source;
  };
  virtual ShippedTemplate shipped_chat_template() const { return {}; }
};

// From the resolved deck's tokenizer.path; checks that model.vocab_size covers its ids.
// Throws slimpi::Error naming the file or the keys.
std::shared_ptr<const Tokenizer> make_tokenizer(const Deck& deck);
std::shared_ptr<const Tokenizer> make_tokenizer(const std::string& path);

// The first difference between two vocabularies ("" when they are the same): their size,
// their stop ids, then the text of every id (a teacher's must equal its student's).
std::string vocabulary_difference(const Tokenizer& a, const Tokenizer& b);

}  // namespace slimpi
