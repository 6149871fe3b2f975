// Deck keys of the tokenizer:
// declared beside the code that reads them, collected by deck_keys() (cli/deck_keys.cpp).
#include "deck/key_tables.h"

namespace slimpi {

std::vector<KeySpec> tokenizer_keys() {
  return {
      // [tokenizer]
      string_key("tokenizer.path", "",
                 "\"bytes\" (slimpi's byte tokenizer), or a Hugging Face tokenizer directory / tokenizer.json "
                 "(byte-level BPE); \"\" = model.init_from's directory when it holds a tokenizer.json, else bytes")
  };
}

}  // namespace slimpi
