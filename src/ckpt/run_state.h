// RunState — the part of a checkpoint that is not the trainer's: where the run stands
// and every rank's random-number state. Written by world rank 0 into run_state.h5 of a
// checkpoint directory (after gathering every rank's RNG), read back by every rank.
//
// Synchronous runs need no data-buffer entry: a step trains every group it kept, and
// the over-sampling surplus of a step is discarded (its prompts are consumed: the
// cursor says so), so no sampled-but-untrained group outlives a step boundary
// (pending_groups = 0). Under train.async = "one_step_off" the batch generated during
// the step is trained by the next one: pending_groups counts its groups, and the
// checkpoint holds it (pending_rollout.h5 / .json, written by the router).
// Layout: attributes step, prompt_cursor, prompt_epoch, pending_groups, world_size, layout,
// reached_target, reached_pass1 (absent from older checkpoints);
// datasets rng/rank_<r> (uint8: the rank's torch CPU generator state).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace slimpi::ckpt {

struct RunState {
  int64_t step = 0;            // the step the run continues at
  int64_t prompt_cursor = 0;   // prompts handed out so far (RL)
  int64_t prompt_epoch = 0;
  int64_t pending_groups = 0;  // sampled but untrained groups (one_step_off; see above)
  std::string layout;          // ckpt::describe_layout() of the world that wrote it
  bool reached_target = false; // the run ended at eval.stop_at_pass1: nothing left to do
  double reached_pass1 = -1;   // the eval/pass@1 that reached it (-1: none, or a checkpoint older than this field)
  std::vector<std::vector<uint8_t>> rng_per_rank;  // [world size] torch CPU generator states
};

// This process's torch CPU generator state, and back.
std::vector<uint8_t> local_rng_state();
void restore_local_rng_state(const std::vector<uint8_t>& state);

// Collective over `world`: gathers every rank's RNG into state.rng_per_rank on rank 0,
// which writes `path`. Other ranks' `state` fields are ignored.
void write_run_state(MPI_Comm world, const std::string& path, RunState state);
// Reads `path` (any rank, serial).
RunState read_run_state(const std::string& path);

}  // namespace slimpi::ckpt
