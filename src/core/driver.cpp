#include "core/driver.h"

#include <slimpi/sample.h>

#include "core/log.h"
#include "core/timer.h"
#include "io/metrics_log.h"
#include "io/rollout_log.h"

namespace slimpi {

Driver::Driver(RunContext& ctx) : ctx_(ctx) {
  phases_ = {
      {"prompts", false, &Driver::prompts},         {"rollout", false, &Driver::rollout},
      {"reward", false, &Driver::reward},           {"buffer", true, &Driver::buffer},
      {"train", false, &Driver::train},             {"weight_sync", false, &Driver::weight_sync},
      {"metrics", true, &Driver::metrics},          {"checkpoint", false, &Driver::checkpoint},
  };
  const std::string deck_text = ctx_.deck.to_toml();
  rollouts_ = std::make_unique<RolloutLog>(RolloutLog::create(ctx_.run_dir + "/rollouts.h5", ctx_.world->world(),
                                                              deck_text));
  metrics_ = std::make_unique<MetricsLog>(ctx_.run_dir, ctx_.world->world(), deck_text);
  for (const auto& p : phases_)
    if (!p.built) log::info("step table: phase '{}' is not built yet and is skipped every step", p.name);
}

Driver::~Driver() = default;

int64_t Driver::run() {
  const int64_t n_steps = ctx_.deck.get_int("run.n_steps");
  log::info("starting {} step(s)", n_steps);
  Stopwatch total;
  for (int64_t step = 0; step < n_steps; ++step) {
    step_clock_.restart();
    phase_times_.clear();
    step_samples_.clear();
    for (const auto& p : phases_) {
      if (!p.built) continue;
      Stopwatch clock;
      (this->*p.body)(step);
      phase_times_[fmt::format("time/{}_s", p.name)] = clock.seconds();
    }
  }
  log::info("finished {} step(s) in {:.3f} s; outputs in {}", n_steps, total.seconds(), ctx_.run_dir);
  return n_steps;
}

// Phases whose subsystem is not built yet: called by nobody (Phase::built is false).
void Driver::prompts(int64_t) {}
void Driver::rollout(int64_t) {}
void Driver::reward(int64_t) {}
void Driver::train(int64_t) {}
void Driver::weight_sync(int64_t) {}
void Driver::checkpoint(int64_t) {}

void Driver::buffer(int64_t) {
  // Every rank appends its finished samples of the step (collective, rank order).
  rollouts_->append(step_samples_);
  rollouts_->flush();
}

void Driver::metrics(int64_t step) {
  // Per-rank phase times as rows of /ranks; their max over ranks as the step's perf/*.
  // (The metrics and checkpoint phases of a step come after its row is written.)
  std::map<std::string, double> mine = phase_times_;
  mine["time/step_s"] = step_clock_.seconds();
  metrics_->log_ranks(step, mine);

  std::vector<double> local, max_over_ranks(mine.size());
  for (const auto& [k, v] : mine) local.push_back(v);
  MPI_Reduce(local.data(), max_over_ranks.data(), static_cast<int>(local.size()), MPI_DOUBLE, MPI_MAX, 0,
             ctx_.world->world());
  uint64_t n_local = step_samples_.size(), n_samples = 0;
  MPI_Reduce(&n_local, &n_samples, 1, MPI_UINT64_T, MPI_SUM, 0, ctx_.world->world());

  std::map<std::string, double> row;
  size_t i = 0;
  for (const auto& [k, v] : mine) {
    // "time/buffer_s" -> "perf/buffer_time"; "time/step_s" -> "perf/step_time"
    std::string phase = k.substr(5, k.size() - 7);
    row["perf/" + phase + "_time"] = max_over_ranks[i++];
  }
  row["rollout/n_samples"] = static_cast<double>(n_samples);
  metrics_->log_step(step, row);
  log::info("step {}/{}  step_time {:.4f} s  samples {}", step + 1, ctx_.deck.get_int("run.n_steps"),
            row["perf/step_time"], n_samples);
}

}  // namespace slimpi
