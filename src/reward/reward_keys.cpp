// Deck keys of rewards:
// declared beside the code that reads them, collected by deck_keys() (cli/deck_keys.cpp).
#include "deck/key_tables.h"

#include "reward/reward.h"

namespace slimpi {

std::vector<KeySpec> reward_keys() {
  return {
      // [reward]
      choice_key("reward.style", "exact_match", reward_styles().names(),
                 "verifier that scores responses against labels"),
      string_key("reward.command", "", "style command: program reading JSON lines, answering one number per line"),
      float_key("reward.command_timeout_s", 60.0, 0.01, 1e6, "s", "style command: time limit per batch"),
      int_key("reward.command_max_stderr_bytes", 1 << 16, 0, 1e10, "bytes",
              "style command: stderr lines of the command logged a call (prefixed); the rest read and dropped, its "
              "last lines logged before an error")
  };
}

}  // namespace slimpi
