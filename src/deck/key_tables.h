// Key tables — how each folder declares the deck keys its code reads (the schema's
// entries, deck/schema.h), and the one place they are collected. A folder's keys live in
// its <folder>_keys.cpp beside the code that reads them (its registry's names as a
// key's choices come from there too, so no folder includes one above it);
// deck_keys() (cli/deck_keys.cpp, above every folder) gathers every table in the
// order `slimpi keys` prints them. A new key is one entry in its folder's file; a
// folder with keys of its own adds one function here and one line in deck_keys().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deck/schema.h"

namespace slimpi {

// Every key slimpi understands, table by table (Schema's contents).
std::vector<KeySpec> deck_keys();

// Each folder's keys (defined in src/<folder>/<folder>_keys.cpp).
std::vector<KeySpec> driver_keys();     // run, eval, checkpoint, teacher, debug; train.async
std::vector<KeySpec> parallel_keys();   // parallel
std::vector<KeySpec> model_keys();      // model
std::vector<KeySpec> tokenizer_keys();  // tokenizer
std::vector<KeySpec> data_keys();       // data
std::vector<KeySpec> rollout_keys();    // rollout (but the filter's and the environments')
std::vector<KeySpec> buffer_keys();     // rollout.dynamic_filter
std::vector<KeySpec> env_keys();        // rollout.environment, rollout.env_*
std::vector<KeySpec> reward_keys();     // reward
std::vector<KeySpec> train_keys();      // critic, train (but train.async)

// The entries' shapes: a number in [lo, hi] with its unit, free text, a flag, one of `choices`.
KeySpec int_key(std::string key, int64_t def, double lo, double hi, std::string unit, std::string help);
KeySpec float_key(std::string key, double def, double lo, double hi, std::string unit, std::string help);
KeySpec string_key(std::string key, std::string def, std::string help);
KeySpec bool_key(std::string key, bool def, std::string help);
KeySpec choice_key(std::string key, std::string def, std::vector<std::string> choices, std::string help);
// A registry's names with "auto" first (a key whose "auto" resolves to one of them).
std::vector<std::string> with_auto(std::vector<std::string> names);

constexpr double kMaxInt = 9.0e15;  // exactly representable in a double

}  // namespace slimpi
