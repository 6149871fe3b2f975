#include "driver/driver.h"

#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <algorithm>

#include "ckpt/checkpoint_dir.h"
#include "core/exit_guard.h"
#include "core/file_write.h"
#include "core/log.h"
#include "driver/check_run_deck.h"
#include "driver/step_phases.h"
#include "io/metrics_log.h"
#include "io/rollout_log.h"
#include "parallel/mpi_bytes.h"
#include "parallel/watchdog.h"
#include "train/trainer.h"

namespace slimpi {

Driver::Driver(RunContext& ctx) : ctx_(ctx) {
  const Deck& deck = ctx_.deck;
  parts_ = load_run_inputs(ctx_, check_run_deck(deck, ctx_.world->layout()));
  MPI_Comm_dup(ctx_.world->world(), &errors_);
  choose_resume();
  build_run_components(ctx_, resume_from_, parts_);
  phases_ = std::make_unique<StepPhases>(ctx_, parts_);
  schedule_ = step_schedules().get(deck.get_string("train.async"))(*phases_);
  step_table_ = schedule_->phases();
  step_table_.push_back({"metrics", true, [this](int64_t s) { metrics(s); }});
  step_table_.push_back({"checkpoint", true, [this](int64_t s) { checkpoint(s); }});
  resume_and_open_files();
  phases_->set_rollout_log(rollouts_.get());
  for (const auto& p : step_table_)
    if (!p.used) log::info("step table: phase '{}' is not used in this mode and is skipped every step", p.name);
}

Driver::~Driver() = default;

int64_t Driver::run() {
  const int64_t n_steps = ctx_.deck.get_int("run.n_steps");
  if (start_step_ >= n_steps && !resume_from_.empty()) {
    log::info("the run is already at step {} (checkpoint {}), run.n_steps = {} ({}): nothing to do", start_step_,
              resume_from_, n_steps, ctx_.deck.source("run.n_steps"));
    mark_run_complete(start_step_);
    return start_step_;
  }
  log::info("running steps {}..{} of {} ({})", start_step_ + 1, n_steps, n_steps, parts_.rl ? "rl" : "sft");
  Stopwatch total;
  int64_t step = start_step_;
  try {
    for (; step < n_steps && !phases_->reached_target() && !halt_; ++step) {
      phases_->begin_step();
      for (const auto& p : step_table_) {
        if (!p.used) continue;
        Stopwatch clock;
        p.body(step);
        phases_->step().phase_times[fmt::format("time/{}_s", p.name)] = clock.seconds();
      }
    }
  } catch (const Error& e) {
    // In split placement an error every trainer raises (a non-finite loss: the loss and
    // norm are reduced over the trainers) is not seen by the rollout ranks, which wait
    // for the trainers at record or weight sync: it must end the job from here. An error
    // every rank raised (a write that failed, agreed over the world) still ends the job
    // the usual way, printed once with exit code 1: the ranks agree on which it is.
    const World& w = *ctx_.world;
    const MPI_Comm side = w.is_trainer() ? w.trainer() : w.rollout();
    int side_size = 0;
    MPI_Comm_size(side, &side_size);
    if (!e.collective() || side_size == w.size() || every_rank_arrives(errors_, 10.0)) throw;
    end_job_for_side_error(e, side);
  }
  if (halt_) {
    log::info("stopped at the step boundary after step {} of {} in {:.3f} s; run the same command again to continue "
              "from {}/{}",
              step, n_steps, total.seconds(), ckpt_root_, ckpt::step_dir_name(step));
    return step;
  }
  finish(step);
  if (phases_->n_short_batches() > 0)
    log::info("{} of the {} steps of this job trained a short batch (rollout/short_batch_groups in metrics.h5)",
              phases_->n_short_batches(), step - start_step_);
  log::info("finished: step {} of {} in {:.3f} s; outputs in {}", step, n_steps, total.seconds(), ctx_.run_dir);
  return step;
}

void Driver::finish(int64_t steps) {
  std::map<std::string, double>& row = phases_->step().metrics;
  if (!parts_.eval_prompts.empty()) {  // the final evaluation: row n_steps
    row.clear();
    schedule_->before_final_eval(steps);
    phases_->run_eval(steps);
    log_metrics([&] { metrics_->log_step(steps, row); });
    if (row.count("eval/pass@1")) log::info("final eval (after {} steps): pass@1 {:.3f}", steps, row.at("eval/pass@1"));
  }
  const std::string state_path = ctx_.run_dir + "/trainer_state.h5";
  run_on_all_and_agree(ctx_.world->world(), "writing " + state_path, [&] {
    if (parts_.trainer) parts_.trainer->save(state_path, ctx_.world->trainer());
  });
  if (parts_.trainer && rank_in(ctx_.world->trainer()) == 0)
    log::info("trainer state (model, optimizer, RNG) written to {}", state_path);
  mark_run_complete(steps);
}

void Driver::log_metrics(const std::function<void()>& write) {
  run_on_all_and_agree(ctx_.world->world(), "[metrics] writing " + metrics_->h5_path(), write);
}

void Driver::mark_run_complete(int64_t steps) {
  run_on_all_and_agree(ctx_.world->world(), "the run's COMPLETE marker", [&] {
    if (ctx_.world->rank() == 0) write_file(ctx_.run_dir + "/COMPLETE", fmt::format("run complete: {} steps\n", steps));
  });
}

void Driver::metrics(int64_t step) {
  // Per-rank phase times as rows of /ranks; their max over ranks as the step's perf/*.
  // (The metrics and checkpoint phases of a step come after its row is written.)
  StepState& st = phases_->step();
  std::map<std::string, double> mine = st.phase_times;
  mine["time/step_s"] = st.clock.seconds();
  log_metrics([&] { metrics_->log_ranks(step, mine); });
  std::vector<double> local, max_over_ranks(mine.size());
  for (const auto& [k, v] : mine) local.push_back(v);
  static const std::string reduce_context = "[metrics] phase times, max over ranks";
  WaitGuard guard({&reduce_context, "MPI_Reduce", local.size(), "f64", 0});
  MPI_Reduce(local.data(), max_over_ranks.data(), static_cast<int>(local.size()), MPI_DOUBLE, MPI_MAX, 0,
             ctx_.world->world());
  std::map<std::string, double> row = st.metrics;
  size_t i = 0;
  for (const auto& [k, v] : mine) {
    std::string phase = k.substr(5, k.size() - 7);  // "time/buffer_s" -> "buffer"
    row["perf/" + phase + "_time"] = max_over_ranks[i++];
  }
  // The share of the step (so far) that trainer rank 0 (world rank 0) does not spend
  // training or syncing, and that the router does not spend generating or scoring.
  double router_busy = st.generation_s + st.phase_times["time/reward_s"];
  router_busy = parts_.rl ? std::min(1.0, router_busy / mine["time/step_s"]) : 0.0;
  {
    static const std::string context = "[metrics] the router's busy share";
    WaitGuard bcast_guard({&context, "MPI_Bcast", 1, "f64", parts_.router_world_rank});
    MPI_Bcast(&router_busy, 1, MPI_DOUBLE, parts_.router_world_rank, ctx_.world->world());
  }
  if (ctx_.world->rank() == 0 && parts_.trainer) {
    const double busy = st.phase_times["time/train_s"] + st.phase_times["time/weight_sync_s"];
    row["perf/trainer_idle_fraction"] = std::max(0.0, 1.0 - busy / mine["time/step_s"]);
    if (parts_.rl) row["perf/rollout_idle_fraction"] = 1.0 - router_busy;
  }
  log_metrics([&] { metrics_->log_step(step, row); });
  std::string text;
  auto add = [&](const char* key, const char* label, const char* format) {
    if (row.count(key)) text += fmt::format(fmt::runtime(std::string("  ") + label + " " + format), row.at(key));
  };
  add("train/loss", "loss", "{:.4f}");
  add("rollout/raw_reward", "reward", "{:.3f}");
  add("eval/pass@1", "eval_pass@1", "{:.3f}");
  add("rollout/response_len/mean", "resp_len", "{:.1f}");
  add("train/grad_norm", "grad_norm", "{:.3f}");
  log::info("step {}/{}  {:.3f} s{}", step + 1, ctx_.deck.get_int("run.n_steps"), row["perf/step_time"], text);
}

}  // namespace slimpi
