// The subcommands of the slimpi executable (registered on a CLI11 app in main):
//   run DECK [--set key=value ...]   an RL job (collective over MPI_COMM_WORLD)
//   generate DECK [--set ...]        the rollout side alone: prompts -> rollouts.h5
//   make-data TASK --out FILE        JSONL for a built-in verifiable task
//   check DECK [--set ...] [--np N]  every deck rule for a job of N ranks, without running it
//   keys [prefix] [--markdown]       every deck key: type, default, range, unit, help
//   inspect FILE.h5                  a short summary of a run file
// `--version` is handled by the app itself.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace slimpi::cli {

class Commands {
 public:
  explicit Commands(CLI::App& app);
  // Runs the subcommand the command line chose; returns the exit code.
  int run_selected();

 private:
  CLI::App* run_ = nullptr;
  CLI::App* generate_ = nullptr;
  CLI::App* make_data_ = nullptr;
  std::string task_, data_out_;
  int64_t data_n_ = 1000;
  int64_t data_seed_ = 1;
  CLI::App* check_ = nullptr;
  int check_np_ = 0;  // 0: the ranks `slimpi check` runs on
  CLI::App* keys_ = nullptr;
  bool keys_markdown_ = false;
  CLI::App* inspect_ = nullptr;
  CLI::App* export_ = nullptr;
  std::string deck_path_;
  std::vector<std::string> overrides_;
  std::string key_prefix_;
  std::string h5_path_;
  std::string ckpt_dir_, export_dir_;
  std::string export_dtype_ = "fp32", export_shard_ = "5GB";
};

// The text of `slimpi keys [prefix]`.
std::string describe_keys(const std::string& prefix);
// `slimpi keys --markdown`: the deck reference, one table per deck table
// (docs/deck_reference.md is this text; a test keeps the two the same).
std::string describe_keys_markdown();
// `slimpi check`: the deck's rules for a job of `n_ranks` (check_run_deck); returns
// the summary rank 0 prints. Collective over MPI_COMM_WORLD.
std::string check_deck(const std::string& deck_path, const std::vector<std::string>& overrides, int n_ranks);

}  // namespace slimpi::cli
