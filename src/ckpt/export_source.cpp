#include "ckpt/export_source.h"

#include <slimpi/error.h>

#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/resume.h"

namespace slimpi::ckpt {
namespace fs = std::filesystem;
namespace {

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

bool looks_like_checkpoint(const fs::path& dir) {
  return is_file(dir / "deck.json") || is_file(dir / "manifest.json") || is_file(dir / "DONE");
}

// A run directory's checkpoint root: checkpoint.dir of its deck.resolved.toml when
// that names a directory that exists, else <run dir>/ckpt.
fs::path run_checkpoint_root(const fs::path& run_dir) {
  try {
    const toml::table deck = toml::parse_file((run_dir / "deck.resolved.toml").string());
    const std::string dir = deck["checkpoint"]["dir"].value_or(std::string());
    std::error_code ec;
    if (!dir.empty() && fs::is_directory(dir, ec)) return dir;
  } catch (const toml::parse_error&) {
    // An unreadable deck.resolved.toml: the default root is all that is left to try.
  }
  return run_dir / "ckpt";
}

// The newest checkpoint under `root` that verifies; throws listing what was found.
std::string newest_checkpoint(const fs::path& root, const std::string& what) {
  const CheckpointSearch found = newest_verified_checkpoint(root.string());
  if (!found.dir.empty()) return found.dir;
  if (found.rejected.empty())
    SLIMPI_FAIL("{}: no checkpoint (step_XXXXXXXX directory) under {}; a run writes one every checkpoint.interval "
                "steps and at its end",
                what, root.string());
  std::vector<std::string> lines;
  for (const auto& [dir, problem] : found.rejected) lines.push_back(dir + ": " + problem);
  SLIMPI_FAIL("{}: no checkpoint under {} verifies:\n  {}", what, root.string(), fmt::join(lines, "\n  "));
}

void verify_or_fail(const std::string& dir) {
  if (auto problem = verify_checkpoint(dir)) SLIMPI_FAIL("{} is not a usable checkpoint: {}", dir, *problem);
}

bool inside(const fs::path& p, const fs::path& dir) {
  const fs::path a = fs::weakly_canonical(p), b = fs::weakly_canonical(dir);
  auto [end_b, end_a] = std::mismatch(b.begin(), b.end(), a.begin(), a.end());
  return end_b == b.end();
}

}  // namespace

ExportSource find_export_source(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  if (!fs::exists(p, ec)) SLIMPI_FAIL("{}: no such file or directory", path);
  ExportSource s;
  if (is_file(p)) {
    const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
    if (looks_like_checkpoint(dir)) {  // a checkpoint's own trainer_state.h5
      verify_or_fail(dir.string());
      s.checkpoint_dir = dir.string();
      s.description = "checkpoint " + s.checkpoint_dir;
    } else if (is_file(dir / "deck.resolved.toml")) {  // a run directory's final trainer_state.h5
      s.checkpoint_dir = newest_checkpoint(run_checkpoint_root(dir), path);
      s.description = fmt::format("{} (the model's shape from {})", path, s.checkpoint_dir);
    } else {
      SLIMPI_FAIL("{}: no checkpoint beside it (deck.json) and no run directory around it (deck.resolved.toml), so "
                  "the model's shape is unknown; export a checkpoint directory or a run directory",
                  path);
    }
    s.weights = path;
    return s;
  }
  if (looks_like_checkpoint(p)) {
    verify_or_fail(path);
    s.checkpoint_dir = path;
    s.description = "checkpoint " + path;
  } else if (!list_step_dirs(path).empty()) {
    s.checkpoint_dir = newest_checkpoint(p, path);
    s.description = fmt::format("newest checkpoint {} of {}", s.checkpoint_dir, path);
  } else if (is_file(p / "deck.resolved.toml")) {
    s.checkpoint_dir = newest_checkpoint(run_checkpoint_root(p), "run directory " + path);
    s.description = fmt::format("newest checkpoint {} of run {}", s.checkpoint_dir, path);
  } else {
    SLIMPI_FAIL("{} is not a checkpoint (no deck.json or DONE), a checkpoint root (no step_XXXXXXXX directories) or "
                "a run directory (no deck.resolved.toml)",
                path);
  }
  s.weights = s.checkpoint_dir + "/trainer_state.h5";
  return s;
}

void check_export_destination(const ExportSource& source, const std::string& out_dir) {
  const fs::path ckpt_dir(source.checkpoint_dir);
  const fs::path root = ckpt_dir.parent_path().empty() ? fs::path(".") : ckpt_dir.parent_path();
  if (inside(out_dir, ckpt_dir) || fs::weakly_canonical(out_dir) == fs::weakly_canonical(root))
    SLIMPI_FAIL("export into {} refused: it is (inside) the checkpoint {} or its root; choose a directory of its own",
                out_dir, source.checkpoint_dir);
}

}  // namespace slimpi::ckpt
