// Choosing the checkpoint a job continues from, and checking that it fits the deck.
//
// checkpoint.resume = "never": start fresh. "auto": the newest step_* directory under
// the checkpoint root whose DONE marker exists and whose manifest checksums verify
// (a corrupt or unfinished one is skipped with a warning; no step_* at all = start
// fresh; step_* directories of which none verifies = an error listing each).
// Anything else is a checkpoint directory that must verify, or the job stops.
// Called on world rank 0 only; the driver broadcasts the outcome.
#pragma once

#include <slimpi/deck.h>

#include <string>
#include <utility>
#include <vector>

#include "parallel/world.h"

namespace slimpi::ckpt {

// The checkpoint directory to resume from, or "" to start fresh. Throws slimpi::Error
// when checkpoint.resume names a directory that is missing, unfinished or corrupt, or
// when "auto" finds checkpoints and none of them verifies.
std::string choose_checkpoint(const Deck& deck, const std::string& root);

// The newest step_* directory under `root` that verifies ("" when none does), and
// what is wrong with each newer one that does not.
struct CheckpointSearch {
  std::string dir;
  std::vector<std::pair<std::string, std::string>> rejected;  // (directory, what is wrong)
};
CheckpointSearch newest_verified_checkpoint(const std::string& root);

// Deck keys that must equal the checkpoint's: the model's shape, the seed, the
// training mode and data file. (The world layout is compared separately.)
bool is_structural_key(const std::string& key);

struct DeckDifferences {
  std::vector<std::string> structural;  // "model.hidden_size: 128 in the checkpoint, 256 now (--set)"
  std::vector<std::string> other;       // changes that are allowed (logged)
};
DeckDifferences compare_decks(const Deck& stored, const Deck& now);

// What contradicts itself in a verified checkpoint written with `stored` (its deck.json),
// each a line naming the file: run_state.h5's step against the directory's name
// (step_XXXXXXXX; a directory named otherwise is not compared), and a checkpoint of a
// PPO run whose trainer_state.h5 holds no critic (resumed, the critic would silently be
// a copy of the policy). Empty when it is consistent.
std::vector<std::string> checkpoint_inconsistencies(const std::string& dir, const Deck& stored);

// A one-line description of a layout ("split: 4 ranks, 2 trainer + 2 rollout").
std::string describe_layout(const WorldLayout& layout);

}  // namespace slimpi::ckpt
