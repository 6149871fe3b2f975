// Driver: the checkpoint phase, resuming, and the run files (see driver.h).
#include <slimpi/error.h>

#include <chrono>
#include <ctime>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "data/prompt_source.h"
#include "ckpt/checkpoint_dir.h"
#include "ckpt/resume.h"
#include "ckpt/run_state.h"
#include "driver/driver.h"
#include "driver/step_phases.h"
#include "rollout/rollout_side.h"
#include "sync/engine_weights.h"
#include "core/file_write.h"
#include "core/log.h"
#include "core/stop_signal.h"
#include "io/metrics_log.h"
#include "io/rollout_log.h"
#include "io/tensor_io.h"
#include "parallel/mpi_bytes.h"
#include "parallel/watchdog.h"
#include "train/trainer.h"

namespace slimpi {
namespace fs = std::filesystem;

namespace {

// Test hook (fault injection): SLIMPI_FAULT_CHECKPOINT_PAUSE_AT=<step> makes rank 0
// sleep 60 s inside the write of checkpoint step_<step>, after its data files and
// before its manifest and DONE, so that a test can kill the job mid-checkpoint.
bool fault_pause_at(int64_t step) {
  const char* v = std::getenv("SLIMPI_FAULT_CHECKPOINT_PAUSE_AT");
  return v && std::atoll(v) == step;
}

// Moves what an earlier run left in the run directory (its HDF5 files, trainer state,
// COMPLETE marker and, when the checkpoint root is the run's own, its checkpoints)
// into <run dir>/previous_<UTC time>/: a fresh start never deletes data.
void move_old_run_aside(const std::string& run_dir, const std::string& ckpt_root, bool own_ckpt_root) {
  std::vector<std::string> names = {"rollouts.h5", "metrics.h5", "metrics.csv", "trainer_state.h5", "COMPLETE"};
  std::vector<fs::path> old;
  for (const auto& n : names)
    if (fs::exists(run_dir + "/" + n)) old.push_back(run_dir + "/" + n);
  if (own_ckpt_root && !ckpt::list_step_dirs(ckpt_root).empty()) old.push_back(ckpt_root);
  if (old.empty()) return;
  char stamp[32] = {0};
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", std::gmtime(&now));
  fs::path aside = fs::path(run_dir) / (std::string("previous_") + stamp);
  for (int k = 1; fs::exists(aside); ++k) aside = fs::path(run_dir) / fmt::format("previous_{}_{}", stamp, k);
  fs::create_directories(aside);
  for (const auto& p : old) fs::rename(p, aside / p.filename());
  log::warn("fresh start: the earlier run's files in {} were moved to {} (delete it yourself if unneeded)", run_dir,
            aside.string());
}

}  // namespace

void Driver::choose_resume() {
  const Deck& deck = ctx_.deck;
  MPI_Comm world = ctx_.world->world();
  const bool root = ctx_.world->rank() == 0;
  ckpt_root_ = deck.get_string("checkpoint.dir").empty() ? ctx_.run_dir + "/ckpt" : deck.get_string("checkpoint.dir");
  const std::string layout = ckpt::describe_layout(ctx_.world->layout());

  // Rank 0 picks the checkpoint and checks it against this deck and world.
  std::string chosen;
  run_on_all_and_agree(world, "cannot resume", [&] {
    if (!root) return;
    // The checkpoint root must be writable now, not at the first checkpoint.
    std::error_code ec;
    fs::create_directories(ckpt_root_, ec);
    const std::string probe = ckpt_root_ + "/.slimpi_write_test";
    if (ec || !std::ofstream(probe) || !fs::remove(probe, ec))
      SLIMPI_FAIL("checkpoint directory {} ({}) is not writable{}", ckpt_root_,
                  deck.get_string("checkpoint.dir").empty() ? "run.dir/ckpt" : deck.source("checkpoint.dir"),
                  ec ? ": " + ec.message() : std::string());
    chosen = ckpt::choose_checkpoint(deck, ckpt_root_);
    if (chosen.empty()) {
      move_old_run_aside(ctx_.run_dir, ckpt_root_, deck.get_string("checkpoint.dir").empty());
      return;
    }
    const Deck stored = ckpt::read_checkpoint_deck(chosen);
    const ckpt::DeckDifferences diff = ckpt::compare_decks(stored, deck);
    const std::string stored_layout = ckpt::read_run_state(chosen + "/run_state.h5").layout;
    std::vector<std::string> problems = diff.structural;
    if (stored_layout != layout)
      problems.push_back(fmt::format("world layout: {} in the checkpoint, {} now", stored_layout, layout));
    if (!problems.empty())
      SLIMPI_FAIL("checkpoint {} does not fit this job; these must not change:\n  {}", chosen,
                  fmt::join(problems, "\n  "));
    if (const auto odd = ckpt::checkpoint_inconsistencies(chosen, stored); !odd.empty())
      SLIMPI_FAIL("checkpoint {} contradicts itself and is not resumed from (damaged or edited by hand):\n  {}\n"
                  "name another checkpoint with checkpoint.resume, or set checkpoint.resume = \"never\" to start over",
                  chosen, fmt::join(odd, "\n  "));
    for (const auto& line : diff.other) log::info("resume: changed since the checkpoint: {}", line);
    fs::remove(ctx_.run_dir + "/COMPLETE");  // the run goes on
  });
  broadcast_string(world, chosen, 0);
  resume_from_ = chosen;
}

void Driver::load_checkpoint(const std::string& chosen) {
  run_on_all_and_agree(ctx_.world->world(), fmt::format("cannot load checkpoint {}", chosen), [&] {
    const ckpt::RunState rs = ckpt::read_run_state(chosen + "/run_state.h5");
    start_step_ = rs.step;
    // A run that ended at its target goes on when this deck sets none (0) or one above the
    // pass@1 it reached (a checkpoint older than reached_pass1: only without a target).
    const double target = ctx_.deck.get_float("eval.stop_at_pass1");
    const bool still = rs.reached_target && target > 0 && (rs.reached_pass1 < 0 || rs.reached_pass1 >= target);
    phases_->set_reached_target(still, still ? rs.reached_pass1 : -1);
    if (rs.reached_target && !still)
      log::info("that run ended at eval/pass@1 = {}, which reached its eval.stop_at_pass1; now {} ({}): it goes on",
                rs.reached_pass1 < 0 ? std::string("(not recorded)") : fmt::format("{:.3f}", rs.reached_pass1),
                target, ctx_.deck.source("eval.stop_at_pass1"));
    if (parts_.trainer) parts_.trainer->load(chosen + "/trainer_state.h5");
    if (parts_.engine_model)  // the policy as a sync sends it (sync/engine_weights.h)
      load_engine_weights(*parts_.engine_model, parts_.engine_fp8, uint64_t(ctx_.deck.get_int("run.seed")),
                          chosen + "/trainer_state.h5");
    if (parts_.prompt_source) parts_.prompt_source->set_cursor(rs.prompt_cursor);
    if (parts_.rollout_side) parts_.rollout_side->set_weight_version(rs.step);
    schedule_->load_in_flight(chosen, rs.pending_groups);
    ckpt::restore_local_rng_state(rs.rng_per_rank.at(static_cast<size_t>(ctx_.world->rank())));
  });
  log::info("resuming at step {} from {} (prompt cursor {})", start_step_, chosen,
            parts_.prompt_source ? parts_.prompt_source->cursor() : 0);
  if (phases_->reached_target()) log::info("that run had reached eval.stop_at_pass1: no step is left to run");
}

void Driver::resume_and_open_files() {
  const Deck& deck = ctx_.deck;
  MPI_Comm world = ctx_.world->world();
  const bool root = ctx_.world->rank() == 0;
  const std::string& chosen = resume_from_;
  // Which run files are there to continue (each is kept when intact, whatever the other).
  int files[2] = {0, 0};  // rollouts.h5, metrics.h5
  if (root && !chosen.empty()) {
    files[0] = fs::exists(ctx_.run_dir + "/rollouts.h5");
    files[1] = fs::exists(ctx_.run_dir + "/metrics.h5");
  }
  {
    static const std::string context = "[resume] rank 0's view of the run files";
    WaitGuard guard({&context, "MPI_Bcast", 2, "i32", 0});
    MPI_Bcast(files, 2, MPI_INT, 0, world);
  }

  if (!chosen.empty()) load_checkpoint(chosen);
  else log::info("starting fresh (checkpoint.resume = \"{}\"; checkpoints go to {})",
                 deck.get_string("checkpoint.resume"), ckpt_root_);

  const std::string deck_text = deck.to_toml();
  const std::string rollouts_path = ctx_.run_dir + "/rollouts.h5";
  // metrics.h5 continues from the checkpoint's step; a run with nothing left to do keeps
  // its row of that step too (the final evaluation's, when there was one).
  const int64_t metrics_from = start_step_ >= deck.get_int("run.n_steps") ? start_step_ + 1 : start_step_;
  if (!chosen.empty()) {
    // Rank 0 cuts the files back alone (serial HDF5): a job killed while writing them
    // can leave the file's end of allocation and its size apart, which a serial open
    // repairs on close but which makes ranks of a parallel open disagree.
    run_on_all_and_agree(world, "cannot cut the run's files back to the checkpoint", [&] {
      if (!root) return;
      // A job killed while writing (or stopped by a full disk) can leave either file
      // damaged: say which, and what to do, not HDF5's whole error chain.
      auto cut = [&](const std::string& path, const std::function<void()>& body) {
        try {
          body();
        } catch (const Error& e) {
          const std::string what = e.what();
          if (auto full = disk_space_problem(path))  // not damaged: the cut itself needs room
            SLIMPI_FAIL("cannot cut {} back to step {}: {}; free space and run again", path, start_step_, *full);
          SLIMPI_FAIL("{} is damaged and cannot be continued ({}). Move it away (mv {} {}.damaged) and run "
                      "again: the run resumes from checkpoint {} with a new {} that holds steps {} on (what "
                      "HDF5 can still read of the earlier steps stays in the moved file)",
                      path, what.substr(0, what.find(" <- ")), path, path, chosen,
                      std::filesystem::path(path).filename().string(), start_step_);
        }
      };
      if (files[0])
        cut(rollouts_path, [&] {
          RolloutLog::open(rollouts_path, MPI_COMM_NULL, /*writable=*/true).truncate_to_step(start_step_);
        });
      if (files[1])
        cut(ctx_.run_dir + "/metrics.h5", [&] { MetricsLog(ctx_.run_dir, MPI_COMM_NULL, MetricsLog::ResumeAt{metrics_from}); });
    });
  }
  if (files[0]) {
    rollouts_ = std::make_unique<RolloutLog>(RolloutLog::open(rollouts_path, world, /*writable=*/true));
  } else {
    if (!chosen.empty())
      log::warn("resuming without {}: a new one holds steps {} on", rollouts_path, start_step_);
    rollouts_ = std::make_unique<RolloutLog>(RolloutLog::create(rollouts_path, world, deck_text));
  }
  if (files[1]) {
    metrics_ = std::make_unique<MetricsLog>(ctx_.run_dir, world, MetricsLog::ResumeAt{metrics_from});
  } else {
    if (!chosen.empty())
      log::warn("resuming without {}/metrics.h5: a new one holds steps {} on", ctx_.run_dir, start_step_);
    metrics_ = std::make_unique<MetricsLog>(ctx_.run_dir, world, deck_text);
  }
  if (!chosen.empty())
    log::info("run files continue from step {} ({} samples, {} metric rows kept)", start_step_,
              rollouts_->n_samples(), metrics_->n_rows());
  install_stop_signal_handlers();  // (again: a no-op after `slimpi run` installed them)
}

void Driver::checkpoint(int64_t step) {
  const Deck& deck = ctx_.deck;
  const int64_t next = step + 1;
  // Every rank agrees on whether a stop signal reached any of them during this step.
  int sig = pending_stop_signal();
  {
    static const std::string context = "[checkpoint] agreeing on stop signals";
    WaitGuard guard({&context, "MPI_Allreduce", 1, "i32"});
    MPI_Allreduce(MPI_IN_PLACE, &sig, 1, MPI_INT, MPI_MAX, ctx_.world->world());
  }
  const int64_t interval = deck.get_int("checkpoint.interval");
  const int64_t job_steps = deck.get_int("run.job_steps");
  const bool last = next >= deck.get_int("run.n_steps") || phases_->reached_target();
  if (!last && sig != 0) {
    halt_ = true;
    log::info("{} received: stopping after step {} with a checkpoint", signal_name(sig), next);
  } else if (!last && job_steps > 0 && next - start_step_ >= job_steps) {
    halt_ = true;
    log::info("run.job_steps = {} reached: stopping after step {} with a checkpoint", job_steps, next);
  }
  if (last || halt_ || (interval > 0 && next % interval == 0)) write_checkpoint(next);
}

void Driver::write_checkpoint(int64_t next_step) {
  Stopwatch clock;
  MPI_Comm world = ctx_.world->world();
  const bool root = ctx_.world->rank() == 0;  // also trainer rank 0 in both placements
  const std::string dir = ckpt_root_ + "/" + ckpt::step_dir_name(next_step);
  const std::string context = "checkpoint " + dir;
  run_on_all_and_agree(world, context, [&] {
    if (!root) return;
    fs::remove_all(dir);  // an unfinished write of the same step, from a killed job
    fs::create_directories(dir);
  });
  rollouts_->flush();
  run_on_all_and_agree(world, context, [&] {
    if (parts_.trainer) parts_.trainer->save(dir + "/trainer_state.h5", ctx_.world->trainer());
  });
  // What the schedule holds between steps (one_step_off: the batch generated during
  // this step, which the next step trains; full: the queue and every unfinished sequence).
  const int64_t pending_groups = schedule_->save_in_flight(dir, context);
  ckpt::RunState rs;
  rs.step = next_step;
  rs.pending_groups = pending_groups;
  rs.prompt_cursor = parts_.prompt_source ? parts_.prompt_source->cursor() : 0;
  rs.prompt_epoch = parts_.prompt_source ? parts_.prompt_source->epoch() : 0;
  rs.layout = ckpt::describe_layout(ctx_.world->layout());
  rs.reached_target = phases_->reached_target();
  rs.reached_pass1 = phases_->reached_pass1();
  run_on_all_and_agree(world, context, [&] { ckpt::write_run_state(world, dir + "/run_state.h5", rs); });
  if (root && fault_pause_at(next_step)) {
    log::info("fault injection: pausing 60 s inside {} before its manifest", dir);
    std::this_thread::sleep_for(std::chrono::seconds(60));
  }
  run_on_all_and_agree(world, context, [&] {
    if (!root) return;
    ckpt::write_checkpoint_file(dir + "/deck.json", ctx_.deck.to_json());
    ckpt::write_checkpoint_file(dir + "/deck.toml", ctx_.deck.to_toml());
    std::vector<std::string> files = {"run_state.h5", "deck.json", "deck.toml"};
    if (parts_.trainer) files.insert(files.begin(), "trainer_state.h5");
    for (const std::string& f : schedule_->in_flight_files(pending_groups)) files.push_back(f);
    ckpt::write_manifest(dir, files);
  });
  // Every rank has finished its part (the agreement above is a barrier): mark it done.
  run_on_all_and_agree(world, context, [&] {
    if (!root) return;
    ckpt::write_done_marker(dir, next_step);
    for (const auto& old : ckpt::prune_checkpoints(ckpt_root_, ctx_.deck.get_int("checkpoint.keep_last"),
                                                   ctx_.deck.get_int("checkpoint.keep_every")))
      log::info("checkpoint {} removed (checkpoint.keep_last / keep_every)", old);
  });
  log::info("checkpoint {} written in {:.3f} s (resumes at step {})", dir, clock.seconds(), next_step);
}

}  // namespace slimpi
