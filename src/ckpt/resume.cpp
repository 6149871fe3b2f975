#include "ckpt/resume.h"

#include <slimpi/error.h>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/run_state.h"
#include "deck/schema.h"
#include "core/log.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "train/advantages.h"
#include "train/critic.h"

namespace slimpi::ckpt {

std::string choose_checkpoint(const Deck& deck, const std::string& root) {
  const std::string& mode = deck.get_string("checkpoint.resume");
  if (mode == "never") return "";
  if (mode != "auto") {
    if (auto problem = verify_checkpoint(mode))
      SLIMPI_FAIL("checkpoint.resume = \"{}\" ({}) cannot be resumed from: {}", mode,
                  deck.source("checkpoint.resume"), *problem);
    return mode;
  }
  const auto [dir, skipped] = newest_verified_checkpoint(root);
  std::vector<std::string> rejected;
  for (const auto& [bad, problem] : skipped) {
    log::warn("checkpoint {} skipped: {}", bad, problem);
    rejected.push_back(bad + ": " + problem);
  }
  if (!dir.empty()) return dir;
  // Only unfinished writes (a job that ended inside its first checkpoint, e.g. on a full
  // disk): there is nothing to resume from, so the run starts over (the caller keeps
  // the earlier files aside). A finished checkpoint that fails its checks is another
  // matter: never start over (and overwrite the run) on a guess.
  const bool all_unfinished = std::all_of(skipped.begin(), skipped.end(), [](const auto& s) {
    return is_unfinished_checkpoint(s.first);
  });
  if (!rejected.empty() && all_unfinished) {
    log::warn("checkpoint.resume = \"auto\" ({}): no finished checkpoint under {} ({} unfinished: no DONE marker); "
              "starting over",
              deck.source("checkpoint.resume"), root, skipped.size());
    return "";
  }
  if (!rejected.empty())
    SLIMPI_FAIL("checkpoint.resume = \"auto\" ({}): no checkpoint under {} can be resumed from:\n  {}\nset "
                "checkpoint.resume = \"never\" to start over (the earlier run's files are then moved aside), or "
                "name a checkpoint directory",
                deck.source("checkpoint.resume"), root, fmt::join(rejected, "\n  "));
  return "";
}

std::vector<std::string> checkpoint_inconsistencies(const std::string& dir, const Deck& stored) {
  std::vector<std::string> out;
  const std::string name = std::filesystem::path(dir).lexically_normal().filename().string();
  const std::string leaf = name.empty() ? std::filesystem::path(dir).lexically_normal().parent_path().filename().string()
                                        : name;
  const int64_t step = read_run_state(dir + "/run_state.h5").step;
  if (auto named = parse_step_dir_name(leaf); named && *named != step)
    out.push_back(fmt::format("{}/run_state.h5 says step {}, but the directory is named for step {}", dir, step,
                              *named));
  const std::string& estimator = stored.get_string("train.advantage_estimator");
  if (stored.get_string("train.mode") == "rl" && advantage_estimators().has(estimator) &&
      advantage_estimators().get(estimator).needs_critic && !file_holds_critic(dir + "/trainer_state.h5"))
    out.push_back(fmt::format("{}/trainer_state.h5 holds no critic group, but the run that wrote it trained one "
                              "(its deck.json: train.advantage_estimator = \"{}\")", dir, estimator));
  return out;
}

CheckpointSearch newest_verified_checkpoint(const std::string& root) {
  CheckpointSearch found;
  for (int64_t step : list_step_dirs(root)) {
    const std::string dir = root + "/" + step_dir_name(step);
    auto problem = verify_checkpoint(dir);
    if (!problem) {
      found.dir = dir;
      break;
    }
    found.rejected.emplace_back(dir, *problem);
  }
  return found;
}

bool is_structural_key(const std::string& key) {
  if (key.rfind("model.", 0) == 0) return key != "model.init_from";
  // data.chat_template and what it renders: which lines are records (too long ones are
  // skipped) and what their tokens are; train.async: whether a checkpoint holds a
  // generated-but-untrained batch.
  return key == "run.seed" || key == "train.mode" || key == "data.path" || key == "tokenizer.path" ||
         key == "data.chat_template" || key == "data.system_prompt" || key == "data.enable_thinking" ||
         key == "train.async";
}

DeckDifferences compare_decks(const Deck& stored, const Deck& now) {
  DeckDifferences d;
  for (const auto& [key, entry] : now.entries()) {
    auto it = stored.entries().find(key);
    if (key.rfind("checkpoint.resume", 0) == 0) continue;  // how to resume is not a property of the run
    // (read_checkpoint_deck gives keys newer than the checkpoint their default behaviour.)
    const std::string before = it == stored.entries().end() ? "(absent)" : format_deck_value(it->second.value);
    const std::string after = format_deck_value(entry.value);
    if (before == after) continue;
    std::string line = fmt::format("{}: {} in the checkpoint, {} now ({})", key, before, after, entry.source);
    (is_structural_key(key) ? d.structural : d.other).push_back(std::move(line));
  }
  return d;
}

std::string describe_layout(const WorldLayout& l) {
  if (l.placement == Placement::Colocate) return fmt::format("colocate: {} ranks", l.world_size);
  return fmt::format("split: {} ranks, {} trainer + {} rollout", l.world_size, l.n_trainer, l.n_rollout);
}

}  // namespace slimpi::ckpt
