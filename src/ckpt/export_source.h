// What `slimpi export PATH OUT` exports, from whatever a user points it at:
//   a checkpoint directory     ckpt/step_XXXXXXXX (must verify)
//   a checkpoint root          ckpt/: its newest checkpoint that verifies
//   a run directory            its checkpoint root (checkpoint.dir from its
//                              deck.resolved.toml, else <run dir>/ckpt), as above
//   a trainer_state.h5         those weights, with the deck of the checkpoint beside it
//                              or, in a run directory, of the run's newest checkpoint
// Plain functions, no state; called on one rank.
#pragma once

#include <string>

namespace slimpi::ckpt {

struct ExportSource {
  std::string checkpoint_dir;  // a verified checkpoint: its deck.json gives the model's shape and tokenizer
  std::string weights;         // the trainer_state.h5 whose /model is exported
  std::string description;     // how PATH was read, for the summary line
};

// Throws slimpi::Error saying what PATH is not, and what would be accepted.
ExportSource find_export_source(const std::string& path);

// Throws when `out_dir` is (or is inside) the checkpoint directory or its root: an
// export there would mix model files into what a resume verifies.
void check_export_destination(const ExportSource& source, const std::string& out_dir);

}  // namespace slimpi::ckpt
