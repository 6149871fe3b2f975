// RunContext — what every part of a running job shares, built once by `slimpi run`:
// the resolved deck, the world (roles, communicators), the device choice and the run
// directory. Owned by the command that runs the job; passed by reference, never copied.
#pragma once

#include <slimpi/deck.h>

#include <memory>
#include <string>

#include "parallel/device.h"
#include "parallel/world.h"

namespace slimpi {

struct RunContext {
  Deck deck;
  std::unique_ptr<World> world;
  DeviceChoice device;
  std::string run_dir;
};

// Loads the deck collectively, checks the world layout, chooses the device, creates
// the run directory and writes deck.resolved.toml there; prints the resolved deck, the
// runtime settings and the rank layout on rank 0. Collective over `world`.
// every_rank_rolls_out: the command uses every rank as an engine (slimpi generate);
// the deck's placement is then ignored (logged) and the layout is colocated.
RunContext set_up_run(MPI_Comm world, const std::string& deck_path, const std::vector<std::string>& overrides,
                      bool every_rank_rolls_out = false);

}  // namespace slimpi
