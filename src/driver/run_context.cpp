#include "driver/run_context.h"

#include <slimpi/error.h>

#include <filesystem>
#include <fstream>

#include "config/deck_broadcast.h"
#include "core/log.h"
#include "core/runtime_info.h"
#include "parallel/mpi_bytes.h"
#include "parallel/watchdog.h"

namespace slimpi {
namespace {

// Creates the run directory on rank 0; every rank learns whether it worked.
void make_run_dir(MPI_Comm world, const std::string& dir) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  std::string problem;
  if (rank == 0) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) problem = ec.message();
  }
  broadcast_string(world, problem, 0);
  if (!problem.empty()) SLIMPI_FAIL_ALL("cannot create run directory '{}' (run.dir): {}", dir, problem);
}

}  // namespace

RunContext set_up_run(MPI_Comm world, const std::string& deck_path, const std::vector<std::string>& overrides,
                      bool every_rank_rolls_out) {
  RunContext ctx;
  ctx.deck = load_deck_collective(world, deck_path, overrides);
  Watchdog::instance().start(ctx.deck.get_float("parallel.timeout_s"));

  int size = 0;
  MPI_Comm_size(world, &size);
  WorldLayout layout = every_rank_rolls_out ? WorldLayout{Placement::Colocate, size, size, size}
                                            : resolve_layout(ctx.deck, size);
  if (every_rank_rolls_out)
    log::info("every rank is a rollout engine for this command (parallel.placement and the rank counts are ignored)");

  const std::string& dir = ctx.deck.get_string("run.dir");
  ctx.run_dir = dir.empty() ? "runs/" + ctx.deck.get_string("run.name") : dir;
  make_run_dir(world, ctx.run_dir);

  ctx.world = std::make_unique<World>(world, layout);
  RuntimeSettings rt = apply_runtime_settings(world, ctx.deck.get_int("run.threads"));
  ctx.device = choose_device(world, ctx.deck.get_string("run.device"), ctx.deck.get_string("parallel.comm_backend"),
                             rt.local_rank);

  const std::string resolved = ctx.deck.to_toml();
  if (ctx.world->rank() == 0) {
    std::ofstream(ctx.run_dir + "/deck.resolved.toml") << "# slimpi resolved deck: " << deck_path << "\n\n"
                                                       << resolved;
    log::info("resolved deck ({}):\n{}", deck_path, resolved);
    log::info("{}", rt.describe());
    log::info("{}", ctx.device.reason);
  }
  std::string layout_text = ctx.world->describe();
  log::info("{}", layout_text);
  log::info("run directory: {}", ctx.run_dir);
  return ctx;
}

}  // namespace slimpi
