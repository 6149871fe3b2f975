// Deck keys of the dynamic filter:
// declared beside the code that reads them, collected by deck_keys() (cli/deck_keys.cpp).
#include "deck/key_tables.h"

#include "buffer/dynamic_filter.h"

namespace slimpi {

std::vector<KeySpec> buffer_keys() {
  return {
      // [rollout]
      choice_key("rollout.dynamic_filter", "none", dynamic_filters().names(),
                 "drop groups whose rewards are all equal (nonzero_std) and sample more")
  };
}

}  // namespace slimpi
