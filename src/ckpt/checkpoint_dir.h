// Checkpoint directories on disk: <checkpoint.dir>/step_XXXXXXXX/ holds everything a
// run needs to continue after step XXXXXXXX − 1 (i.e. it resumes at step XXXXXXXX):
//
//   trainer_state.h5   model + optimizer + trainer rank 0's torch RNG (Trainer::save)
//   run_state.h5       step, prompt cursor, every rank's RNG state (RunState)
//   deck.json          the resolved deck, lossless (structural-key check on resume)
//   deck.toml          the same deck, for people
//   manifest.json      {"files": [{"name", "bytes", "xxh64"}...]} of the files above
//   DONE               written last, after every rank has finished its part
//
// A directory without DONE is incomplete (a crash during the write) and is never
// resumed from. Plain functions, no state; called on one rank (rank 0) only.
#pragma once

#include <slimpi/deck.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace slimpi::ckpt {

// "step_00000012"
std::string step_dir_name(int64_t step);
// The step of a directory named like step_dir_name(), or nullopt.
std::optional<int64_t> parse_step_dir_name(const std::string& name);

// Steps of the step_* directories under `root`, newest first (complete or not).
std::vector<int64_t> list_step_dirs(const std::string& root);

// XXH64 of a file's bytes, as 16 hex digits. Throws when the file cannot be read.
std::string file_xxh64(const std::string& path);

// Writes `text` to `path` (a checkpoint's own file); throws naming it when the write
// fails (a full disk).
void write_checkpoint_file(const std::string& path, const std::string& text);
// Writes dir/manifest.json listing `files` (names relative to dir) with sizes and
// checksums.
void write_manifest(const std::string& dir, const std::vector<std::string>& files);
// Writes dir/DONE and flushes it and the directory to disk (fsync).
void write_done_marker(const std::string& dir, int64_t step);

// The resolved deck a checkpoint was written with (dir/deck.json).
Deck read_checkpoint_deck(const std::string& dir);

// Whether dir is a checkpoint whose write never finished (it exists, without DONE).
bool is_unfinished_checkpoint(const std::string& dir);

// nullopt when dir has DONE and every file of its manifest has the recorded size and
// checksum; otherwise what is wrong ("no DONE marker", "run_state.h5: checksum ...").
std::optional<std::string> verify_checkpoint(const std::string& dir);

// Deletes complete checkpoints beyond the newest `keep_last` unless their step is a
// multiple of keep_every (> 0), and incomplete ones older than the newest complete one.
// Returns the directories removed.
std::vector<std::string> prune_checkpoints(const std::string& root, int64_t keep_last, int64_t keep_every);

}  // namespace slimpi::ckpt
