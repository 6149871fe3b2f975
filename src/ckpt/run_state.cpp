#include "ckpt/run_state.h"


#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <slimpi/error.h>

#include "io/h5.h"
#include "io/tensor_io.h"
#include "parallel/watchdog.h"

namespace slimpi::ckpt {

std::vector<uint8_t> local_rng_state() {
  at::Tensor t = at::detail::getDefaultCPUGenerator().get_state().contiguous();  // uint8 [n]
  const uint8_t* p = t.data_ptr<uint8_t>();
  return std::vector<uint8_t>(p, p + t.numel());
}

void restore_local_rng_state(const std::vector<uint8_t>& state) {
  at::Tensor t = at::empty({static_cast<int64_t>(state.size())}, at::kByte);
  std::copy(state.begin(), state.end(), t.data_ptr<uint8_t>());
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(t);
}

void write_run_state(MPI_Comm world, const std::string& path, RunState state) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  std::vector<uint8_t> mine = local_rng_state();
  int n = static_cast<int>(mine.size());
  std::vector<int> counts(size), displs(size);
  static const std::string context = "[checkpoint] every rank's run state to rank 0";
  WaitGuard guard({&context, "MPI_Gather"});
  MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, world);
  std::vector<uint8_t> all;
  if (rank == 0) {
    for (int r = 1; r < size; ++r) displs[r] = displs[r - 1] + counts[r - 1];
    all.resize(static_cast<size_t>(displs[size - 1] + counts[size - 1]));
  }
  MPI_Gatherv(mine.data(), n, MPI_BYTE, all.data(), counts.data(), displs.data(), MPI_BYTE, 0, world);
  if (rank != 0) return;
  state.rng_per_rank.clear();
  for (int r = 0; r < size; ++r)
    state.rng_per_rank.emplace_back(all.begin() + displs[r], all.begin() + displs[r] + counts[r]);

  h5::File f = h5::File::create(path, MPI_COMM_NULL);
  h5::write_attr(f.id(), "step", state.step);
  h5::write_attr(f.id(), "prompt_cursor", state.prompt_cursor);
  h5::write_attr(f.id(), "prompt_epoch", state.prompt_epoch);
  h5::write_attr(f.id(), "pending_groups", state.pending_groups);
  h5::write_attr(f.id(), "world_size", int64_t(size));
  h5::write_attr(f.id(), "layout", state.layout);
  h5::write_attr(f.id(), "reached_target", int64_t(state.reached_target));
  h5::write_attr(f.id(), "reached_pass1", state.reached_pass1);
  h5::Handle rng = h5::create_group(f.id(), "rng");
  for (int r = 0; r < size; ++r) {
    const auto& s = state.rng_per_rank[r];
    at::Tensor t = at::from_blob(const_cast<uint8_t*>(s.data()), {static_cast<int64_t>(s.size())}, at::kByte);
    write_tensor(rng.id(), fmt::format("rank_{}", r), t);
  }
  rng.reset();
  f.close();  // throws when the data did not all reach the file
}

RunState read_run_state(const std::string& path) {
  h5::File f = h5::File::open(path, false, MPI_COMM_NULL);
  RunState s;
  s.step = h5::read_attr_int(f.id(), "step");
  s.prompt_cursor = h5::read_attr_int(f.id(), "prompt_cursor");
  s.prompt_epoch = h5::read_attr_int(f.id(), "prompt_epoch");
  s.pending_groups = h5::read_attr_int(f.id(), "pending_groups");
  const int64_t size = h5::read_attr_int(f.id(), "world_size");
  s.layout = h5::read_attr_string(f.id(), "layout");
  s.reached_target = h5::read_attr_int(f.id(), "reached_target") != 0;
  s.reached_pass1 = h5::has_attr(f.id(), "reached_pass1") ? h5::read_attr_double(f.id(), "reached_pass1") : -1;
  h5::Handle rng = h5::open_group(f.id(), "rng");
  for (int64_t r = 0; r < size; ++r) {
    at::Tensor t = read_tensor(rng.id(), fmt::format("rank_{}", r)).contiguous();
    s.rng_per_rank.emplace_back(t.data_ptr<uint8_t>(), t.data_ptr<uint8_t>() + t.numel());
  }
  return s;
}

}  // namespace slimpi::ckpt
