#include "cli/commands.h"

#include <mpi.h>
#include <slimpi/error.h>
#include <slimpi/version.h>

#include <fmt/ranges.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/resume.h"
#include "cli/make_data.h"
#include "config/deck_broadcast.h"
#include "driver/check_run_deck.h"
#include "parallel/world.h"
#include "core/file_write.h"
#include "deck/schema.h"
#include "driver/driver.h"
#include "core/exit_guard.h"
#include "core/log.h"
#include "io/inspect.h"
#include "ckpt/hf_export.h"
#include "parallel/mpi_bytes.h"
#include "driver/generate.h"

namespace slimpi::cli {

Commands::Commands(CLI::App& app) {
  run_ = app.add_subcommand("run", "run an RL job described by a deck (under mpirun/srun)");
  run_->add_option("deck", deck_path_, "the input deck (TOML)")->required();
  run_->add_option("--set", overrides_, "override a deck key: --set table.key=value (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);

  generate_ = app.add_subcommand("generate", "generate rollouts for the prompts of data.path (rollout side only)");
  generate_->add_option("deck", deck_path_, "the input deck (TOML)")->required();
  generate_->add_option("--set", overrides_, "override a deck key: --set table.key=value (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);

  make_data_ = app.add_subcommand("make-data", "write JSONL for a built-in task (addition, multiplication, countdown, tool_multiplication, coding, coding_heldout)");
  make_data_->add_option("task", task_, "the task")->required();
  make_data_->add_option("--out", data_out_, "the JSONL file to write")->required();
  make_data_->add_option("--n", data_n_, "number of records")->capture_default_str();
  make_data_->add_option("--seed", data_seed_, "seed of the draws")->capture_default_str();

  check_ = app.add_subcommand("check", "check a deck's keys and every rule between them for a job of N ranks, "
                                       "without running it (nothing is written)");
  check_->add_option("deck", deck_path_, "the input deck (TOML)")->required();
  check_->add_option("--set", overrides_, "override a deck key: --set table.key=value (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  check_->add_option("--np", check_np_, "ranks of the job to check for (default: the ranks this runs on)")
      ->check(CLI::PositiveNumber);

  keys_ = app.add_subcommand("keys", "print every deck key with its type, default, range, unit and help");
  keys_->add_option("prefix", key_prefix_, "only keys starting with this (e.g. 'rollout' or 'run.seed')");
  keys_->add_flag("--markdown", keys_markdown_, "the deck reference as Markdown (docs/deck_reference.md)");

  export_ = app.add_subcommand("export", "write a checkpoint as a Hugging Face model (safetensors + config.json)");
  export_->add_option("checkpoint", ckpt_dir_,
                      "a checkpoint directory (ckpt/step_XXXXXXXX), a checkpoint root (its newest checkpoint), a run "
                      "directory (its newest checkpoint) or a trainer_state.h5")
      ->required();
  export_->add_option("out", export_dir_, "the output directory")->required();
  export_->add_option("--dtype", export_dtype_, "weights in fp32 or bf16 (the masters rounded once)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  export_->add_option("--max-shard-size", export_shard_, "largest file before the weights are sharded (e.g. 5GB, 500MB)")
      ->capture_default_str();

  inspect_ = app.add_subcommand("inspect", "summarise a slimpi HDF5 file (rollouts.h5, metrics.h5, ...)");
  inspect_->add_option("file", h5_path_, "the HDF5 file")->required()->check(CLI::ExistingFile);
}

int Commands::run_selected() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (*keys_ && keys_markdown_) {
    if (!key_prefix_.empty()) SLIMPI_FAIL_ALL("slimpi keys --markdown writes the whole reference: give no prefix");
    if (rank == 0) std::cout << describe_keys_markdown();
    return 0;
  }
  if (*check_) {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const std::string summary = check_deck(deck_path_, overrides_, check_np_ > 0 ? check_np_ : size);
    if (rank == 0) std::cout << summary;
    return 0;
  }
  if (*keys_) {
    std::string text = describe_keys(key_prefix_);
    if (text.empty()) SLIMPI_FAIL_ALL("no deck key starts with '{}'; `slimpi keys` lists them all", key_prefix_);
    if (rank == 0) std::cout << text;
    return 0;
  }
  if (*make_data_) {
    std::vector<std::string> lines = make_task_data(task_, data_n_, static_cast<uint64_t>(data_seed_));
    if (rank == 0) {
      std::string text;
      for (const auto& l : lines) text += l + '\n';
      write_file(data_out_, text);
      std::cout << fmt::format("make-data: {} {} records (seed {}) -> {}\n", lines.size(), task_, data_seed_, data_out_);
    }
    return 0;
  }
  if (*export_) {
    std::string summary, problem;
    if (rank == 0) {  // one writer; other ranks (if any) only learn the outcome
      try {
        summary = export_checkpoint_to_hf(ckpt_dir_, export_dir_, {export_dtype_, parse_byte_size(export_shard_)});
      } catch (const std::exception& e) {  // filesystem and JSON errors too: other ranks wait for the outcome
        problem = fmt::format("export: {}", e.what());
      }
    }
    broadcast_string(MPI_COMM_WORLD, problem, 0);
    if (!problem.empty()) SLIMPI_FAIL_ALL("{}", problem);
    if (rank == 0) std::cout << summary << "\n";
    return 0;
  }
  if (*inspect_) {
    if (rank == 0) std::cout << inspect_h5(h5_path_);
    return 0;
  }
  log::info("{}", build_description());
  RunContext ctx = set_up_run(MPI_COMM_WORLD, deck_path_, overrides_, /*every_rank_rolls_out=*/bool(*generate_));
  int code = 0;
  if (*generate_) {
    abort_on_local_error([&] { code = run_generate(ctx); });
    return code;
  }
  Driver driver(ctx);
  abort_on_local_error([&] { driver.run(); });
  return 0;
}

namespace {

// A cell of a Markdown table: pipes escaped, no line breaks.
std::string markdown_cell(std::string text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += "\\|";
    else if (c == '\n') out += ' ';
    else out += c;
  }
  return out;
}

}  // namespace

std::string describe_keys_markdown() {
  std::string out =
      "# Deck reference\n\n"
      "<!-- Generated by `slimpi keys --markdown` from the schema (each folder's src/<folder>/<folder>_keys.cpp);\n"
      "     do not edit by hand.\n"
      "     tests/regression/deck_reference.sh fails when this file and the schema differ. -->\n\n"
      "Every key of an input deck, table by table: its type, its default, the values it takes and what it "
      "does. `slimpi keys PREFIX` prints the same for the keys starting with PREFIX; `slimpi check DECK --np N` "
      "checks a deck and the rules between its keys without running it.\n";
  std::string table;
  for (const auto& spec : Schema::instance().keys()) {
    const std::string t = spec.key.substr(0, spec.key.rfind('.'));
    if (t != table) {
      out += fmt::format("\n## [{}]\n\n| key | type | default | values | meaning |\n|---|---|---|---|---|\n", t);
      table = t;
    }
    std::string values;
    if (!spec.choices.empty()) values = fmt::format("{}", fmt::join(spec.choices, ", "));
    else if (spec.min || spec.max)
      values = fmt::format("[{}, {}]", spec.min ? fmt::format("{:g}", *spec.min) : "-inf",
                           spec.max ? fmt::format("{:g}", *spec.max) : "inf");
    if (!spec.unit.empty()) values += (values.empty() ? "" : " ") + std::string("(") + spec.unit + ")";
    out += fmt::format("| `{}` | {} | `{}` | {} | {} |\n", spec.key.substr(t.size() + 1), key_type_name(spec.type),
                       markdown_cell(format_deck_value(spec.default_value)), markdown_cell(values),
                       markdown_cell(spec.help));
  }
  return out;
}

namespace {

// The weights a fresh start reads (teacher.path is checked by check_run_deck, for a run
// too): a note for model.init_from and critic.init_from when they do not exist and the
// job would not resume from a checkpoint (which holds the policy and the critic). A note,
// not an error: a pipeline's later deck names what its earlier job writes
// (inputs/quickstart_grpo.toml reads the SFT job's trainer_state.h5), and is checked
// before that job has run.
std::string missing_init_files(const Deck& deck) {
  const std::string root = deck.get_string("checkpoint.dir").empty() ? run_dir_of(deck) + "/ckpt"
                                                                       : deck.get_string("checkpoint.dir");
  const std::string& resume = deck.get_string("checkpoint.resume");
  const bool resumes = resume != "never" && (resume != "auto" || !ckpt::list_step_dirs(root).empty());
  std::string notes;
  for (const char* key : {"model.init_from", "critic.init_from"}) {
    const std::string& path = deck.get_string(key);
    if (!path.empty() && !resumes && !std::filesystem::exists(path))
      notes += fmt::format("  note: {} = \"{}\" ({}) does not exist (yet): a fresh start reads its weights, and "
                           "stops if it is still missing then\n", key, path, deck.source(key));
  }
  return notes;
}

}  // namespace

std::string check_deck(const std::string& deck_path, const std::vector<std::string>& overrides, int n_ranks) {
  const Deck deck = load_deck_collective(MPI_COMM_WORLD, deck_path, overrides);
  const WorldLayout layout = resolve_layout(deck, n_ranks);
  check_run_deck(deck, layout);
  return missing_init_files(deck) +
         fmt::format("check: {} holds for a job of {} rank{}: {}; train.mode = \"{}\", train.async = \"{}\"\n"
                     "  (the data and evaluation files are read when the job starts)\n",
                     deck_path, n_ranks, n_ranks > 1 ? "s" : "", ckpt::describe_layout(layout),
                     deck.get_string("train.mode"), deck.get_string("train.async"));
}

std::string describe_keys(const std::string& prefix) {
  std::string out;
  std::string table;
  for (const auto& spec : Schema::instance().keys()) {
    if (spec.key.compare(0, prefix.size(), prefix) != 0) continue;
    std::string t = spec.key.substr(0, spec.key.rfind('.'));
    if (t != table) {
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", t);
      table = t;
    }
    std::string constraint;
    if (!spec.choices.empty()) constraint = fmt::format("one of {}", fmt::join(spec.choices, " | "));
    else if (spec.min || spec.max)
      constraint = fmt::format("range [{}, {}]", spec.min ? fmt::format("{:g}", *spec.min) : "-inf",
                               spec.max ? fmt::format("{:g}", *spec.max) : "inf");
    out += fmt::format("  {:<28} {:<8} default {:<10} {}{}\n      {}\n", spec.key, key_type_name(spec.type),
                       format_deck_value(spec.default_value), constraint,
                       spec.unit.empty() ? "" : " (" + spec.unit + ")", spec.help);
  }
  return out;
}

}  // namespace slimpi::cli
