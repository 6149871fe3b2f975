// Trainer::save and Trainer::load: trainer_state.h5, every tensor whole under the whole
// model's name, each rank writing and reading only the part it holds
// (io/tensor_pieces.h).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>

#include <exception>
#include <filesystem>

#include "arch/mtp_names.h"
#include "core/log.h"
#include "io/h5.h"
#include "io/tensor_io.h"
#include "io/tensor_pieces.h"
#include "parallel/mpi_bytes.h"
#include "parallel/watchdog.h"
#include "parallel/world.h"
#include "train/trainer.h"

namespace slimpi {
namespace {

// The parameter a stored tensor belongs to ("exp_avg/<p>" -> "<p>").
std::string parameter_of(const std::string& name) {
  const size_t slash = name.rfind('/');
  return slash == std::string::npos ? name : name.substr(slash + 1);
}

int comm_size(MPI_Comm comm) {
  int n = 1;
  MPI_Comm_size(comm, &n);
  return n;
}

// Whether any rank of `comm` says so (MPI_COMM_NULL: this one).
bool any_rank(bool mine, MPI_Comm comm, const std::string& context) {
  if (comm == MPI_COMM_NULL) return mine;
  int in = mine ? 1 : 0, out = 0;
  WaitGuard guard({&context, "(did any rank fail?) MPI_Allreduce"});
  check_mpi(MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, comm), "MPI_Allreduce");
  return out != 0;
}

}  // namespace

bool Trainer::first_in_tensor_group(const std::string& param) const {
  return first_holder(param, policy_.config(), policy_.tensor_shard());
}

bool Trainer::stores_part(const std::string& name) const {
  // Of the ranks holding the same part of a tensor, the first writes it: a tensor
  // replicated over the tensor group by its rank 0 (a replicated key/value head by the
  // first of its replicas), a data-parallel (and context-parallel) replica's by the first
  // of `replicas`, an expert's by the first of its replicas.
  const std::string param = parameter_of(name);
  if (!first_in_tensor_group(param)) return false;
  if (pipeline_.is_embedding_copy(param, last_stage_copies_embedding(policy_.config()))) return false;  // the first stage's
  if (expert_replicas_ && Transformer::is_expert_parameter(param)) return expert_replicas_->rank() == 0;
  return !replicas_ || replicas_->rank() == 0;
}

void Trainer::save(const std::string& path, MPI_Comm trainer) const {
  if (trainer != MPI_COMM_NULL && comm_size(trainer) == 1) trainer = MPI_COMM_NULL;  // a serial file
  const bool holds_everything = !tensor_group_ && !expert_group_ && pipeline_.size == 1 &&
                                (optimizer_ || !replicas_ || replicas_->size() == 1) &&
                                (!replicas_ || replicas_->rank() == 0);
  SLIMPI_CHECK(trainer != MPI_COMM_NULL || holds_everything, "writing {}: this trainer rank holds only part of the "
               "state; every trainer rank must call Trainer::save with the trainer communicator", path);
  const TensorShard& tp = policy_.tensor_shard();
  const StoredWhole stored{&policy_.config(), tp};
  const bool root = (trainer == MPI_COMM_NULL || rank_in(trainer) == 0);
  // What this rank writes: its part of every parameter it is the first to hold, and of
  // the moments (plain AdamW: as the parameters; distributed: its chunks, every rank).
  const std::vector<NamedTensor> params = policy_.parameters();
  std::vector<TensorPiece> model_pieces, moment_pieces;
  std::vector<NamedTensor> moments;  // declared
  for (const auto& p : params)
    if (stores_part(p.name)) model_pieces.push_back(whole_piece(p.name, p.tensor));
  if (optimizer_) {
    moments = optimizer_->state();
    for (const auto& t : moments)
      if (stores_part(t.name)) moment_pieces.push_back(whole_piece(t.name, t.tensor));
  } else {
    for (const auto& g : groups_) {
      for (auto& t : g.sharded->state_like()) moments.push_back(std::move(t));
      for (auto& piece : g.sharded->moment_pieces())
        if (first_in_tensor_group(parameter_of(piece.name)) &&
            !pipeline_.is_embedding_copy(parameter_of(piece.name), last_stage_copies_embedding(policy_.config()))) {
          piece.values = piece.values.cpu().contiguous();
          moment_pieces.push_back(std::move(piece));
        }
    }
  }
  const at::Tensor rng_state = at::detail::getDefaultCPUGenerator().get_state();
  std::vector<TensorPiece> rng_pieces;  // trainer rank 0's
  if (root) rng_pieces.push_back(whole_piece("torch_cpu", rng_state));

  // Every call below that is collective is made on every rank, even after this rank's
  // writes failed; the first error is raised at the end, and no partial file is left.
  std::exception_ptr error;
  auto keep_going = [&](auto&& body) {
    try {
      body();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  };
  {
    h5::File f = h5::File::create(path, trainer);
    {
      h5::Handle model = h5::create_group(f.id(), "model");
      keep_going([&] { write_tensor_pieces(f, model.id(), stored, params, model_pieces); });
      mark_linear_channel_order(model.id(), policy_.config());
    }
    {
      h5::Handle opt = h5::create_group(f.id(), "optimizer");
      keep_going([&] { write_tensor_pieces(f, opt.id(), stored, moments, moment_pieces); });
      h5::write_attr(opt.id(), "n_steps", n_steps());
    }
    {
      h5::Handle rng = h5::create_group(f.id(), "rng");
      keep_going([&] { write_tensor_pieces(f, rng.id(), StoredWhole{}, {{"torch_cpu", rng_state}}, rng_pieces); });
    }
    // The critic (ppo): a replica on every data-parallel rank (the first writes it), split
    // over the tensor group as the policy is.
    if (critic_) critic_->save(f, /*dp_first=*/!replicas_ || replicas_->rank() == 0, error);
    keep_going([&] { f.close(); });  // throws when the data did not all reach the file
  }
  if (any_rank(error != nullptr, trainer, "writing " + path) && root) {
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
  }
  if (error) std::rethrow_exception(error);
}

void Trainer::load(const std::string& path) {
  // Every tensor is stored whole: each rank reads its experts, its tensor-parallel part
  // and its chunks of the moments.
  const StoredWhole stored{&policy_.config(), policy_.tensor_shard()};
  load_model_weights(policy_.parameters(), path, "model", expert_group_ != nullptr, stored);
  h5::File f = h5::File::open(path, false, MPI_COMM_NULL);
  h5::Handle opt = h5::open_group(f.id(), "optimizer");
  const int64_t steps = h5::read_attr_int(opt.id(), "n_steps");
  // A checkpoint written with a frozen draft (train.mtp_loss_coef = 0) holds no moments
  // for the MTP layers: resumed with the draft trained, they start at zero.
  bool fresh_mtp_moments = false;
  const auto stored_moment = [&](const std::string& name) {
    const size_t slash = name.find('/');
    const bool there = h5::exists(opt.id(), name.substr(0, slash)) && h5::exists(opt.id(), name);
    if (!there && is_mtp_parameter(name.substr(slash + 1))) {
      fresh_mtp_moments = true;
      return false;
    }
    return true;  // (a missing trunk moment is the read's error, as before)
  };
  if (optimizer_) {
    std::vector<NamedTensor> moments;
    for (auto& t : optimizer_->state())
      if (stored_moment(t.name)) moments.push_back(std::move(t));
    read_tensors_into(opt.id(), moments, false, stored);
    optimizer_->set_n_steps(steps);
  } else {
    at::NoGradGuard no_grad;
    for (const auto& g : groups_) {
      std::vector<TensorPiece> pieces;  // views of the moment buffers, read into
      for (auto& piece : g.sharded->moment_pieces())
        if (stored_moment(piece.name)) pieces.push_back(std::move(piece));
      read_tensor_pieces(opt.id(), stored, pieces, false);
    }
    n_steps_ = steps;
  }
  if (fresh_mtp_moments)
    log::info("{}: no optimizer moments for the MTP layers (written with train.mtp_loss_coef = 0): the draft's "
              "AdamW moments start at zero (bias-corrected at the run's step {}, so its first updates are larger)",
              path, steps);
  if (critic_ && !critic_->load(path)) {
    critic_->copy_trunk_from(policy_);
    log::info("{}: no critic (written by a run without one): the critic's trunk is copied from the resumed policy; "
              "its value head is the one built at start (fresh, or critic.init_from's) and its moments start at zero",
              path);
  }
  h5::Handle rng = h5::open_group(f.id(), "rng");
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(read_tensor(rng.id(), "torch_cpu"));
}

}  // namespace slimpi
