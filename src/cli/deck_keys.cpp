// deck_keys(): every folder's key table (deck/key_tables.h), gathered above every folder
// and ordered table by table as `slimpi keys` and docs/deck_reference.md list them.
#include <slimpi/error.h>

#include <algorithm>

#include "deck/key_tables.h"

namespace slimpi {

std::vector<KeySpec> deck_keys() {
  // The tables in the order they are listed; within a table, each folder's keys in its
  // own order, the folders in the order below.
  static const std::vector<std::string> tables = {"run",        "parallel", "model",  "tokenizer", "data",
                                                  "rollout",    "reward",   "eval",   "checkpoint", "teacher",
                                                  "critic",     "debug",    "train"};
  std::vector<KeySpec> keys;
  for (auto* folder : {driver_keys, parallel_keys, model_keys, tokenizer_keys, data_keys, rollout_keys, buffer_keys,
                       env_keys, reward_keys, train_keys})
    for (KeySpec& k : folder()) keys.push_back(std::move(k));
  auto rank = [&](const KeySpec& k) {
    const auto it = std::find(tables.begin(), tables.end(), k.key.substr(0, k.key.find('.')));
    SLIMPI_CHECK(it != tables.end(), "deck key {}: its table is not in deck_keys()'s list", k.key);
    return it - tables.begin();
  };
  std::stable_sort(keys.begin(), keys.end(), [&](const KeySpec& a, const KeySpec& b) { return rank(a) < rank(b); });
  return keys;
}

}  // namespace slimpi
