#include "driver/run_context.h"

#include "agent/agent_token.h"

#include <ATen/CPUGeneratorImpl.h>
#include <slimpi/error.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "config/deck_broadcast.h"
#include "driver/check_run_deck.h"
#include "core/file_write.h"
#include "core/log.h"
#include "core/runtime_info.h"
#include "kernels/batch_invariant.h"
#include "kernels/counter_rng.h"
#include "parallel/mpi_bytes.h"
#include "parallel/watchdog.h"
#include "rollout/rollout_config.h"

namespace slimpi {
namespace {

std::string utc_now() {
  char text[32] = {0};
  const std::time_t now = std::time(nullptr);
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return text;
}

// One job per run directory: rank 0 holds an flock() on <dir>/.slimpi.lock for the
// life of the process (the kernel releases it when the process ends, however it ends,
// so a lock left by a killed job is simply taken over). The file says who holds it.
// "" when locked, else why not.
std::string lock_run_dir(const std::string& dir) {
  // The descriptor stays open (never closed, deliberately) until the process exits:
  // closing it would release the lock.
  const std::string path = dir + "/.slimpi.lock";
  const bool existed = std::filesystem::exists(path);
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return fmt::format("cannot open {}: {}", path, std::strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    std::string holder(512, '\0');
    const ssize_t n = pread(fd, holder.data(), holder.size(), 0);
    holder.resize(n > 0 ? size_t(n) : 0);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    close(fd);
    return fmt::format("another slimpi job is using it ({}); wait for it to end, or set another run.dir",
                       holder.empty() ? "holder unknown" : holder);
  }
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::string me = fmt::format("host {} pid {} since {}\n", host, getpid(), utc_now());
  errno = 0;
  if (ftruncate(fd, 0) != 0 || pwrite(fd, me.data(), me.size(), 0) != ssize_t(me.size())) {
    const std::string why = errno ? std::strerror(errno) : "short write";
    if (!existed) unlink(path.c_str());  // no empty lock file left behind (a full disk)
    close(fd);
    return fmt::format("cannot write {}: {}", path, why);
  }
  return "";
}

// Creates and locks the run directory on rank 0; every rank learns whether it worked.
void make_run_dir(MPI_Comm world, const std::string& dir) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  std::string problem;
  if (rank == 0) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) problem = "cannot create it: " + ec.message();
    else if (!std::filesystem::is_directory(dir)) problem = "it exists and is not a directory";
    else problem = lock_run_dir(dir);
  }
  broadcast_string(world, problem, 0);
  if (!problem.empty()) SLIMPI_FAIL_ALL("run directory '{}' (run.dir): {}", dir, problem);
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
    log::info("every rank is a rollout engine for this command (parallel.placement, the rank counts and the "
              "trainer's layout keys parallel.tensor_parallel, context_parallel, pipeline_parallel, expert_parallel "
              "are ignored; rollout.tensor_parallel sets the engines')");

  ctx.run_dir = run_dir_of(ctx.deck);
  make_run_dir(world, ctx.run_dir);
  if (ctx.deck.get_string("rollout.environment") == "agent") {  // the agent endpoint's token, new per job
    int rank = 0;
    MPI_Comm_rank(world, &rank);
    std::string token;
    std::string problem = rank == 0 ? write_agent_token(ctx.run_dir, &token) : std::string();
    broadcast_string(world, problem, 0);
    if (!problem.empty()) SLIMPI_FAIL_ALL("the agent endpoint's token (rollout.environment = \"agent\"): {}", problem);
    broadcast_string(world, token, 0);
    set_job_agent_token(token);
  }

  ctx.world = std::make_unique<World>(world, layout);
  RuntimeSettings rt = apply_runtime_settings(world, ctx.deck.get_int("run.threads"));
  ctx.device = choose_device(world, ctx.deck.get_string("run.device"), ctx.deck.get_string("parallel.comm_backend"),
                             rt.local_rank);
  // Exact on-policy: the batch-invariant kernels for every forward of this process, set
  // before any model exists (kernels/batch_invariant.h).
  const bool exact = ctx.deck.get_string("train.on_policy") == "exact";
  if (exact && ctx.device.use_cuda)
    SLIMPI_FAIL_ALL("train.on_policy = \"exact\" ({}) runs on the CPU in this version; run.device = \"{}\" ({}) chose "
                    "the GPU: set run.device = \"cpu\"", ctx.deck.source("train.on_policy"),
                    ctx.deck.get_string("run.device"), ctx.deck.source("run.device"));
  if (exact) {  // one kernel level on every rank, or the ranks' products round apart
    int level[2] = {exact_kernel_level(), -exact_kernel_level()};  // MAX of both: the highest and the lowest
    MPI_Allreduce(MPI_IN_PLACE, level, 2, MPI_INT, MPI_MAX, world);
    if (level[0] != -level[1])
      SLIMPI_FAIL_ALL("train.on_policy = \"exact\" ({}) needs every rank on CPUs of one x86-64 level (their kernels "
                      "round alike); this job's ranks run x86-64-v{} and -v{} code: place it on one kind of node",
                      ctx.deck.source("train.on_policy"), -level[1], level[0]);
  }
  set_exact_numerics(exact);
  // The engines' cache storage, which the trainer's exact attention rounds its keys and
  // values to (an SFT run's evaluation engine runs the fp32 policy).
  set_exact_kv_storage(kv_cache_dtype(ctx.deck, ctx.deck.get_string("train.mode") == "rl" || every_rank_rolls_out));
  // torch's default CPU generator, which libtorch seeds from the OS at load: nothing of
  // slimpi draws from it (every draw has its own generator or counter), but checkpoints
  // record its state, so it is seeded from run.seed and the rank, and a run's files repeat.
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(mix_seed(uint64_t(ctx.deck.get_int("run.seed")), 0x746f726368ull, uint64_t(ctx.world->rank())));
  }

  const std::string resolved = ctx.deck.to_toml();
  run_on_all_and_agree(world, "run directory " + ctx.run_dir, [&] {
    if (ctx.world->rank() == 0)
      write_file(ctx.run_dir + "/deck.resolved.toml", "# slimpi resolved deck: " + deck_path + "\n\n" + resolved);
  });
  if (ctx.world->rank() == 0) {
    // One line, not the whole deck: a 100-line dump on stdout let an error on stderr
    // land in its middle (mpirun forwards the two streams independently).
    log::info("resolved deck ({}) written to {}/deck.resolved.toml", deck_path, ctx.run_dir);
    log::info("{}", rt.describe());
    log::info("{}", ctx.device.reason);
  }
  std::string layout_text = ctx.world->describe();
  log::info("{}", layout_text);
  log::info("run directory: {}", ctx.run_dir);
  return ctx;
}

}  // namespace slimpi
