// PromptSource — the RL prompts: JSONL records (prompt under data.input_key, its
// label under data.label_key, optional metadata under data.metadata_key) from a path
// spec "file.jsonl" or "file.jsonl@[a:b]" (records a..b-1, Python slice rules, either
// bound optional), handed out in an order reshuffled every epoch from the run seed.
// The cursor is the number of prompts handed out so far: the checkpoint keeps it, and
// the next prompts are a pure function of (seed, cursor). Every rank holds the same
// PromptSource and agrees on the cursor (the driver broadcasts it).
// With a chat template (spec.chat) every prompt — a message list, or a string taken as
// one user message — is rendered once at load with the generation prompt opened; a
// message list without a template, or one the template cannot render, is a bad line.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/epoch_order.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace slimpi {

class Deck;

struct Prompt {
  int64_t index = 0;  // record index within the (sliced) file
  int64_t line = 0;   // line number in the file (1-based), for error messages
  std::string text;    // the prompt as the model sees it (rendered when chat)
  bool chat = false;   // text is a rendered conversation (encoded by Tokenizer::encode_chat)
  // The record's prompt as the file holds it: the string, or a list of messages as its JSON
  // text ("" in a checkpoint older than this field: then text). An agent gets this, since it
  // renders its own conversation.
  std::string raw;
  std::string label;
  std::string metadata;  // JSON text, "" when absent
};

struct PromptSourceSpec {
  std::string path;  // "file.jsonl" or "file.jsonl@[a:b]"
  std::string input_key = "prompt";
  std::string label_key = "label";
  std::string metadata_key;  // "" = none
  bool skip_bad_lines = false;
  bool label_optional = false;  // slimpi generate: prompts need no label
  // > 0: a prompt whose tokenized length (prompt_token_ids) exceeds this is a bad line
  // (an error naming file:line, or skipped and counted with skip_bad_lines).
  int64_t max_prompt_tokens = 0;
  std::shared_ptr<const Tokenizer> tokenizer;  // measures the prompts (null: the byte tokenizer)
  ChatFormat chat;                             // none: prompts are strings used as they are

  // path with the deck's data.input_key, data.label_key, data.chat_template (and the
  // options that go with it) and `tokenizer`; the rest stays at the defaults above.
  static PromptSourceSpec from_deck(const Deck& deck, const std::string& path,
                                    std::shared_ptr<const Tokenizer> tokenizer);
};

// The prompt's token ids: encode_chat for a rendered conversation, else encode_prompt.
std::vector<int64_t> prompt_token_ids(const Tokenizer& tokenizer, const Prompt& prompt);

class PromptSource {
 public:
  PromptSource(const PromptSourceSpec& spec, uint64_t seed);

  // The next n prompts; advances the cursor.
  std::vector<Prompt> next(int64_t n);
  int64_t cursor() const { return cursor_; }
  void set_cursor(int64_t c) { cursor_ = c; }
  int64_t epoch() const { return cursor_ / static_cast<int64_t>(records_.size()); }
  size_t size() const { return records_.size(); }
  int64_t n_skipped_lines() const { return skipped_; }
  // Every record in file order (evaluation sets).
  const std::vector<Prompt>& records() const { return records_; }

 private:
  std::vector<Prompt> records_;
  EpochOrder order_;
  int64_t cursor_ = 0;
  int64_t skipped_ = 0;
};

// Splits "file@[a:b]" into the file and the record range (negative bounds count from
// the end as in Python; end = INT64_MAX: to the end).
struct PathSlice {
  std::string file;
  int64_t begin = 0;
  int64_t end = INT64_MAX;
  // The records [first, last) it selects of a file of n, bounds clamped as Python's.
  std::pair<int64_t, int64_t> range(int64_t n) const;
};
PathSlice parse_path_slice(const std::string& spec);

}  // namespace slimpi
