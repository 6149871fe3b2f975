#include "core/driver.h"

#include <slimpi/error.h>
#include <slimpi/sample.h>

#include "core/log.h"
#include "core/timer.h"
#include "io/metrics_log.h"
#include "io/rollout_log.h"
#include "io/tensor_io.h"
#include "model/transformer.h"
#include "parallel/comm.h"
#include "tokenizer/byte_tokenizer.h"
#include "train/sft_data.h"
#include "train/trainer.h"

namespace slimpi {

Driver::Driver(RunContext& ctx) : ctx_(ctx) {
  const bool sft = ctx_.deck.get_string("train.mode") == "sft";
  phases_ = {
      {"prompts", false, &Driver::prompts},         {"rollout", false, &Driver::rollout},
      {"reward", false, &Driver::reward},           {"buffer", true, &Driver::buffer},
      {"train", sft, &Driver::train},               {"weight_sync", false, &Driver::weight_sync},
      {"metrics", true, &Driver::metrics},          {"checkpoint", false, &Driver::checkpoint},
  };
  if (sft) set_up_training();
  const std::string deck_text = ctx_.deck.to_toml();
  rollouts_ = std::make_unique<RolloutLog>(RolloutLog::create(ctx_.run_dir + "/rollouts.h5", ctx_.world->world(),
                                                              deck_text));
  metrics_ = std::make_unique<MetricsLog>(ctx_.run_dir, ctx_.world->world(), deck_text);
  for (const auto& p : phases_)
    if (!p.built) log::info("step table: phase '{}' is not built yet and is skipped every step", p.name);
}

Driver::~Driver() = default;

void Driver::set_up_training() {
  const Deck& deck = ctx_.deck;
  if (deck.get_string("data.path").empty())
    SLIMPI_FAIL_ALL("train.mode = \"sft\" ({}) needs a training file: set data.path", deck.source("train.mode"));
  ModelConfig model_cfg = ModelConfig::from_deck(deck);
  if (model_cfg.vocab_size < ByteTokenizer::kVocabSize)
    SLIMPI_FAIL_ALL("model.vocab_size = {} ({}) is smaller than the byte tokenizer's {} tokens", model_cfg.vocab_size,
                    deck.source("model.vocab_size"), ByteTokenizer::kVocabSize);
  TrainerConfig train_cfg = TrainerConfig::from_deck(deck);
  // Every rank reads the data, so that a bad file is an error all ranks raise alike.
  sft_data_ = std::make_unique<SftData>(deck.get_string("data.path"), deck.get_string("data.input_key"),
                                        deck.get_string("data.response_key"), model_cfg.max_seq_len,
                                        static_cast<uint64_t>(deck.get_int("run.seed")));
  if (!ctx_.world->is_trainer()) {
    sft_data_.reset();
    return;
  }
  const at::Device device = ctx_.device.use_cuda ? at::Device(at::kCUDA, ctx_.device.gpu) : at::Device(at::kCPU);
  policy_ = std::make_unique<Transformer>(model_cfg, static_cast<uint64_t>(deck.get_int("run.seed")), device);
  if (!deck.get_string("model.init_from").empty()) load_model_weights(*policy_, deck.get_string("model.init_from"));
  trainer_comm_ = make_comm(ctx_.world->trainer(), "trainer", ctx_.device);
  trainer_ = std::make_unique<Trainer>(train_cfg, *policy_, trainer_comm_.get());
  log::info("policy: {} parameters ({} layers, d {}, {} heads / {} kv heads), on {}; SFT data: {} samples from {}",
            policy_->n_params(), model_cfg.n_layers, model_cfg.hidden_size, model_cfg.n_heads, model_cfg.n_kv_heads,
            device.str(), sft_data_->size(), deck.get_string("data.path"));
}

int64_t Driver::run() {
  const int64_t n_steps = ctx_.deck.get_int("run.n_steps");
  log::info("starting {} step(s)", n_steps);
  Stopwatch total;
  for (int64_t step = 0; step < n_steps; ++step) {
    step_clock_.restart();
    phase_times_.clear();
    step_samples_.clear();
    step_metrics_.clear();
    for (const auto& p : phases_) {
      if (!p.built) continue;
      Stopwatch clock;
      (this->*p.body)(step);
      phase_times_[fmt::format("time/{}_s", p.name)] = clock.seconds();
    }
  }
  if (trainer_ && rank_in(ctx_.world->trainer()) == 0) {
    const std::string path = ctx_.run_dir + "/trainer_state.h5";
    trainer_->save(path);
    log::info("trainer state (model, optimizer, RNG) written to {}", path);
  }
  log::info("finished {} step(s) in {:.3f} s; outputs in {}", n_steps, total.seconds(), ctx_.run_dir);
  return n_steps;
}

// Phases whose subsystem is not built yet: called by nobody (Phase::built is false).
void Driver::prompts(int64_t) {}
void Driver::rollout(int64_t) {}
void Driver::reward(int64_t) {}
void Driver::weight_sync(int64_t) {}
void Driver::checkpoint(int64_t) {}

void Driver::train(int64_t step) {
  if (!trainer_) return;  // not a trainer rank
  const int64_t batch = ctx_.deck.get_int("train.global_batch_size");
  step_metrics_ = trainer_->train_step(sft_data_->batch(step, batch, trainer_comm_->rank(), trainer_comm_->size()));
}

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
  for (const auto& [k, v] : step_metrics_) row[k] = v;
  metrics_->log_step(step, row);
  std::string train_text;
  if (step_metrics_.count("train/loss"))
    train_text = fmt::format("  loss {:.4f}  grad_norm {:.3f}  lr {:.2e}", step_metrics_["train/loss"],
                             step_metrics_["train/grad_norm"], step_metrics_["train/lr"]);
  log::info("step {}/{}  step_time {:.4f} s  samples {}{}", step + 1, ctx_.deck.get_int("run.n_steps"),
            row["perf/step_time"], n_samples, train_text);
}

}  // namespace slimpi
