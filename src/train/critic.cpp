#include "train/critic.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>

#include <cmath>
#include <filesystem>
#include <optional>
#include <tuple>

#include "core/log.h"
#include "io/h5.h"
#include "io/tensor_io.h"
#include "io/tensor_pieces.h"
#include "model/log_probs.h"
#include "model/precision.h"
#include "parallel/comm_tensor.h"
#include "train/metric_sums.h"
#include "train/micro_batches.h"
#include "train/packed_batch.h"
#include "train/pipeline_links.h"
#include "train/pipeline_schedule.h"
#include "train/gradient_groups.h"
#include "train/value_loss.h"

namespace slimpi {
namespace {

constexpr const char* kHeadWeight = "value_head.weight";
constexpr const char* kHeadBias = "value_head.bias";

ModelConfig trunk_config(const ModelConfig& policy) {
  ModelConfig c = policy;
  c.mtp_num_layers = 0;  // the critic predicts values, not drafts
  return c;
}

// Whether `path` is an HDF5 file written by a PPO run (it holds a critic).
bool holds_critic(const std::string& path) {
  if (std::filesystem::is_directory(path) || path.size() < 3 || path.substr(path.size() - 3) != ".h5") return false;
  return file_holds_critic(path);
}

}  // namespace

bool file_holds_critic(const std::string& path) {
  h5::File f = h5::File::open(path, false, MPI_COMM_NULL);
  return h5::exists(f.id(), "critic");
}

Critic::Critic(const TrainerConfig& trainer, const Transformer& policy, Comm* dp, uint64_t seed, Comm* replicas)
    : cfg_(trainer), dp_(dp), replicas_(replicas ? replicas : dp), pipeline_(policy.pipeline_shard()) {
  SLIMPI_CHECK(policy.expert_shard().size <= 1, "the critic is not expert-parallel: the policy is an expert shard");
  const ModelConfig mc = trunk_config(policy.config());
  const TensorShard& tp = policy.tensor_shard();
  trunk_ = std::make_unique<Transformer>(mc, seed, policy.device(), at::kFloat, ExpertShard{}, tp,
                                         policy.context_shard(), pipeline_);
  const StoredWhole stored{&trunk_->config(), tp};
  trunk_->set_recompute(cfg_.recompute);
  const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat).device(policy.device());
  // A fresh head: N(0, init_std) weights from its own stream (the run seed's), zero bias.
  at::Generator gen = at::detail::createCPUGenerator(seed ^ 0x76616c7565ULL);  // "value"
  head_weight_ = at::normal(0.0, mc.init_std, {1, mc.hidden_size}, gen, at::kFloat).to(policy.device());
  head_bias_ = at::zeros({1}, f32);
  for (auto& p : trunk_->parameters())
    if (p.name != "lm_head.weight" && !pipeline_.is_embedding_copy(p.name, last_stage_copies_embedding(mc)))
      trained_.push_back(p);
  for (at::Tensor* t : {&head_weight_, &head_bias_}) t->set_requires_grad(true);
  if (pipeline_.last()) {  // (a pipeline's last stage holds the head)
    trained_.push_back({kHeadWeight, head_weight_});
    trained_.push_back({kHeadBias, head_bias_});
  }

  const std::string& from = cfg_.critic.init_from;
  if (from.empty()) {
    copy_trunk_from(policy);
    log::info("critic: the policy's architecture, its trunk copied from the policy's initial weights, a fresh value "
              "head ({} trained parameters on this rank)", n_trained());
  } else {
    SLIMPI_CHECK(std::filesystem::exists(from), "critic.init_from = \"{}\": no such file or directory (a PPO run's "
                 "trainer_state.h5 or checkpoint, or a Hugging Face model)", from);
    try {
      if (holds_critic(from)) {
        h5::File f = h5::File::open(from, false, MPI_COMM_NULL);
        h5::Handle model = h5::open_group(h5::open_group(f.id(), "critic").id(), "model");
        at::NoGradGuard no_grad;
        check_linear_channel_order(model.id(), trained_, stored, from);
        read_tensors_into(model.id(), trained_, false, stored);
        log::info("critic: trunk and value head from {} (a PPO run's critic)", from);
      } else {
        load_model_weights(trunk_->parameters(), from, "model", false, stored, pipeline_);
        log::info("critic: trunk from {}, which has no value head: a fresh value head", from);
      }
    } catch (const std::exception& e) {  // HDF5's and the loader's text, under the key that named the file
      SLIMPI_FAIL("critic.init_from = \"{}\" cannot be loaded: {}", from, e.what());
    }
  }
  const double kv_replicas = double(kv_head_replicas(mc, tp.size));
  for (const auto& [kind, norm_over, replicas] :
       {std::tuple{GradientGroup::Replicated, (Comm*)nullptr, 1.0}, std::tuple{GradientGroup::TensorSplit, tp.comm, 1.0},
        std::tuple{GradientGroup::KvReplicas, tp.comm, kv_replicas}}) {
    std::vector<NamedTensor> params;
    for (const auto& p : trained_)
      if (group_of(*trunk_, p.name) == kind) params.push_back(p);
    if (!params.empty())
      grads_.push_back({std::make_unique<GradBuffer>(params, cfg_.grad_bucket_bytes), tp.size > 1 ? norm_over : nullptr,
                        replicas});
  }
  AdamW::Options adam = cfg_.adam;
  adam.weight_decay = cfg_.critic.weight_decay;
  optimizer_ = std::make_unique<AdamW>(trained_, adam);
}

void Critic::copy_trunk_from(const Transformer& policy) {
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> source;
  for (const auto& p : policy.parameters()) source.emplace(p.name, p.tensor);
  for (auto& p : trunk_->parameters()) p.tensor.copy_(source.at(p.name));
}

int64_t Critic::n_trained() const {
  int64_t n = 0;
  for (const auto& p : trained_) n += p.tensor.numel();
  return n;
}

at::Tensor Critic::head_values(const PackedBatch& b, const at::Tensor& hidden) const {
  const ScoredPositions at = response_positions(b.tokens, b.seq_lens, b.prompt_lens);
  // Context parallelism: hidden is this rank's rows; it values the tokens they predict,
  // and the group gathers every token's (train/packed_batch.h's log-probs likewise).
  const auto split = trunk_->context_split(b.seq_lens);
  const std::optional<ContextSplit::Items> it = split ? std::optional(split->items(at.logit_rows)) : std::nullopt;
  at::Tensor h = hidden.index_select(0, it ? it->local_rows : at.logit_rows);  // [N, d]: the positions scoring each token
  if (const int t = trunk_->tensor_shard().size; t > 1 && h.requires_grad()) {
    // Every rank of the tensor group holds the whole head and the same loss: the trunk's
    // backward sums the ranks' gradients of h, so each passes 1/t of it (the forward
    // value is h exactly: the difference is zero).
    const at::Tensor held = h.detach();
    h = held + (h - held) * (1.0 / double(t));
  }
  const at::Tensor v = at::linear(h, head_weight_, head_bias_).squeeze(-1);  // [N]
  return it ? split->gather_items(*it, v) : v;
}

std::vector<std::vector<float>> Critic::values(const std::vector<Sample>& samples) const {
  at::NoGradGuard no_grad;
  std::vector<int64_t> lengths;
  for (const auto& s : samples) lengths.push_back(s.packed_length());
  const auto plan = plan_micro_batches(lengths, cfg_.n_micro_batches, cfg_.max_tokens_per_micro_batch);
  const std::vector<at::Tensor> staged = pipeline_.size > 1 ? pipelined_values(samples, plan) : std::vector<at::Tensor>{};
  std::vector<std::vector<float>> out(samples.size());
  for (size_t micro = 0; micro < plan.size(); ++micro) {
    const std::vector<int64_t>& which = plan[micro];
    at::Tensor v;  // [N]
    if (pipeline_.size > 1) {
      v = staged[micro];
    } else {
      const PackedBatch b = pack(samples, which, trunk_->device());
      at::Tensor hidden;  // [T, d] fp32, the final norm's output
      {
        ForwardPrecision scope(cfg_.precision, trunk_->device());
        hidden = trunk_->forward_packed_hidden(b.tokens, b.seq_lens);
      }
      v = head_values(b, hidden);
    }
    v = v.cpu().contiguous();
    int64_t start = 0;
    for (int64_t i : which) {
      const int64_t n = samples[size_t(i)].response_length();
      out[size_t(i)].assign(v.data_ptr<float>() + start, v.data_ptr<float>() + start + n);
      start += n;
    }
  }
  return out;
}

std::vector<at::Tensor> Critic::pipelined_values(const std::vector<Sample>& samples,
                                                 const std::vector<std::vector<int64_t>>& plan) const {
  PipelineLinks links(pipeline_);
  std::vector<at::Tensor> mine;  // the last stage's [N] per micro-batch
  std::vector<int64_t> sizes;
  for (const auto& which : plan) {
    const PackedBatch b = pack(samples, which, trunk_->device());
    const at::Tensor y = stage_forward(*trunk_, links, b, cfg_.precision, /*track_input=*/false);
    int64_t n = 0;
    for (int64_t i : which) n += samples[size_t(i)].response_length();
    sizes.push_back(n);
    if (pipeline_.last()) mine.push_back(head_values(b, y));
    else links.send_forward(y);
  }
  links.finish();
  return from_last_stage(pipeline_, mine, sizes);
}

at::Tensor Critic::value_loss(const std::vector<Sample>& local, const std::vector<int64_t>& which,
                              const PackedBatch& batch, const at::Tensor& v, double n_samples, double n_masked,
                              MetricSums& sums) const {
  const at::Device device = trunk_->device();
  const at::Tensor old_v = gather_field(local, which, &Sample::values, 0.0f, device);
  const at::Tensor returns = gather_field(local, which, &Sample::returns, 0.0f, device);
  const at::Tensor mask = gather_field(local, which, &Sample::loss_mask, 1.0f, device);
  const at::Tensor weight =
      reducer_weights(local, which, batch, mask, n_samples, n_masked, cfg_.calculate_per_token_loss);  // [N]
  const ValueLossTerms terms = value_loss_terms(v, old_v, returns, cfg_.critic.value_clip);
  sums.add("train/value_loss", terms.loss, weight);
  sums.add("train/value_clipfrac", terms.clipped, weight);
  return (terms.loss * weight).sum();
}

void Critic::pipelined_forwards_and_backwards(const std::vector<Sample>& local,
                                              const std::vector<std::vector<int64_t>>& plan, double n_samples,
                                              double n_masked, MetricSums& sums) {
  const at::Device device = trunk_->device();
  const int64_t d = trunk_->config().hidden_size;
  PipelineLinks links(pipeline_);
  struct InFlight {
    at::Tensor input;   // [rows, d] the received activations (requires grad), undefined on the first stage
    at::Tensor output;  // the stage's output [rows, d], or the last stage's loss
  };
  auto forward = [&](int64_t m) {
    const std::vector<int64_t>& which = plan[size_t(m)];
    const PackedBatch batch = pack(local, which, device);
    InFlight f;
    const at::Tensor y = stage_forward(*trunk_, links, batch, cfg_.precision, /*track_input=*/true, &f.input);
    if (pipeline_.last()) {
      f.output = value_loss(local, which, batch, head_values(batch, y), n_samples, n_masked, sums);
    } else {
      links.send_forward(y);
      f.output = y;
    }
    return f;
  };
  auto backward = [&](InFlight& f) {
    if (pipeline_.last()) f.output.backward();
    else f.output.backward(links.recv_backward(f.output.size(0), d, at::TensorOptions().dtype(at::kFloat).device(device)));
    if (!pipeline_.first()) links.send_backward(f.input.grad());
  };
  run_one_f_one_b(pipeline_, int64_t(plan.size()), forward, backward);
  links.finish();
}

std::map<std::string, double> Critic::train_step(const std::vector<Sample>& local) {
  const at::Device device = trunk_->device();
  // The reducer's denominators over every data-parallel rank (the policy loss's).
  double local_counts[2] = {double(local.size()), 0.0};  // samples, counted tokens
  for (const auto& s : local) local_counts[1] += mask_sum(s);
  at::Tensor counts = at::tensor(std::vector<double>(local_counts, local_counts + 2), at::kDouble);
  if (dp_) allreduce(*dp_, counts);
  const double n_samples = counts[0].item<double>(), n_masked = counts[1].item<double>();
  if (n_samples == 0) return {};
  for (auto& g : grads_) g.buffer->zero();
  MetricSums sums;
  for (const char* k : {"train/value_loss", "train/value_clipfrac"}) sums.add_value(k, 0.0);
  std::vector<int64_t> lengths;
  for (const auto& s : local) lengths.push_back(s.packed_length());
  const auto plan = plan_micro_batches(lengths, cfg_.n_micro_batches, cfg_.max_tokens_per_micro_batch);
  if (pipeline_.size > 1) {
    pipelined_forwards_and_backwards(local, plan, n_samples, n_masked, sums);
  } else {
    for (const auto& which : plan) {
      const PackedBatch batch = pack(local, which, device);
      at::Tensor hidden;  // [T, d] fp32, the final norm's output
      {
        ForwardPrecision scope(cfg_.precision, device);
        hidden = trunk_->forward_packed_hidden(batch.tokens, batch.seq_lens);
      }
      value_loss(local, which, batch, head_values(batch, hidden), n_samples, n_masked, sums).backward();
    }
  }
  for (auto& g : grads_) {
    SLIMPI_CHECK(g.buffer->grads_alias_buffer(), "autograd replaced a critic gradient outside its flat buffer");
    g.buffer->all_reduce(replicas_);
  }
  std::map<std::string, double> metrics = sums.reduce(dp_);
  if (pipeline_.size > 1) sum_over_stages(pipeline_, metrics);  // (the last stage's loss terms)
  const double lr = cfg_.critic.lr.at(optimizer_->n_steps());
  const double norm = grad_norm();
  const bool finite = std::isfinite(norm) && std::isfinite(metrics["train/value_loss"]);
  if (finite) {
    for (auto& g : grads_) g.buffer->clip(norm, cfg_.critic.clip_grad);
    optimizer_->step(lr);
  } else if (!cfg_.skip_nonfinite_steps) {
    SLIMPI_FAIL_ALL("critic step {}: the value loss is {} and the gradient norm {}; stopping before they reach the "
                    "weights (train.skip_nonfinite_steps = true skips such steps instead)",
                    optimizer_->n_steps(), metrics["train/value_loss"], norm);
  }
  metrics["train/critic_grad_norm"] = norm;
  metrics["train/critic_lr"] = lr;
  metrics["train/critic_skipped_nonfinite_step"] = finite ? 0.0 : 1.0;
  return metrics;
}

double Critic::grad_norm() const {
  // Every element counted once: the replicated parameters on this rank, the split ones
  // added up over the tensor group (the replicated key/value heads divided by their replicas).
  double sq = 0;
  for (const auto& g : grads_) {
    at::Tensor mine = at::full({1}, std::pow(g.buffer->global_norm(), 2), at::kDouble);
    if (g.norm_over) allreduce(*g.norm_over, mine);
    sq += mine.item<double>() / g.replicas;
  }
  if (pipeline_.size > 1) {  // every stage's parameters
    at::Tensor all = at::full({1}, sq, at::kDouble);
    allreduce(*pipeline_.comm, all);
    sq = all.item<double>();
  }
  return std::sqrt(sq);
}

void Critic::save(const h5::File& file, bool dp_first, std::exception_ptr& error) const {
  // Every collective call (groups, attributes, the datasets' creation) is made on every
  // rank whatever happened before; only this rank's writes may fail, and the first
  // failure is kept in `error` for the caller.
  h5::Handle critic = h5::create_group(file.id(), "critic");
  h5::write_attr(critic.id(), "n_rollouts", n_rollouts_);
  const std::vector<NamedTensor> moments = optimizer_->state();
  for (const auto& [group, tensors] : {std::pair{"model", &trained_}, std::pair{"optimizer", &moments}}) {
    h5::Handle g = h5::create_group(critic.id(), group);
    if (std::string(group) == "optimizer") h5::write_attr(g.id(), "n_steps", optimizer_->n_steps());
    if (std::string(group) == "model") mark_linear_channel_order(g.id(), trunk_->config());
    try {
      std::vector<TensorPiece> pieces;
      for (const auto& t : *tensors)
        if (dp_first && first_holder(t.name, trunk_->config(), trunk_->tensor_shard()))
          pieces.push_back(whole_piece(t.name, t.tensor));
      write_tensor_pieces(file, g.id(), StoredWhole{&trunk_->config(), trunk_->tensor_shard()}, *tensors, pieces);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
}

bool Critic::load(const std::string& path) {
  h5::File f = h5::File::open(path, false, MPI_COMM_NULL);
  if (!h5::exists(f.id(), "critic")) return false;
  h5::Handle critic = h5::open_group(f.id(), "critic");
  at::NoGradGuard no_grad;
  const StoredWhole stored{&trunk_->config(), trunk_->tensor_shard()};
  h5::Handle model = h5::open_group(critic.id(), "model");
  check_linear_channel_order(model.id(), trained_, stored, path);
  read_tensors_into(model.id(), trained_, false, stored);
  h5::Handle opt = h5::open_group(critic.id(), "optimizer");
  read_tensors_into(opt.id(), optimizer_->state(), false, stored);
  optimizer_->set_n_steps(h5::read_attr_int(opt.id(), "n_steps"));
  n_rollouts_ = h5::read_attr_int(critic.id(), "n_rollouts");
  return true;
}

}  // namespace slimpi
