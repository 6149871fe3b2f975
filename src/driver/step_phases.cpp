#include "driver/step_phases.h"

#include <ATen/ATen.h>
#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <algorithm>
#include <limits>

#include "buffer/dynamic_filter.h"
#include "buffer/sample_transport.h"
#include "core/byte_codec.h"
#include "core/log.h"
#include "core/runtime_info.h"
#include "driver/async_generator.h"
#include "driver/replay_source.h"
#include "driver/run_components.h"
#include "io/rollout_log.h"
#include "model/transformer.h"
#include "parallel/comm.h"
#include "parallel/mpi_bytes.h"
#include "parallel/watchdog.h"
#include "reward/batch_scorer.h"
#include "rollout/rollout_side.h"
#include "sync/weight_route.h"
#include "train/advantages.h"
#include "train/model_parallel.h"
#include "train/sft_data.h"
#include "train/teacher_scores.h"
#include "train/trainer.h"

namespace slimpi {
namespace {

// Streams of group seeds: training rollouts use the step; evaluation its own range.
constexpr uint64_t kEvalStream = uint64_t(1) << 40;

std::string encode_metrics(const std::map<std::string, double>& m) {
  ByteWriter w;
  w.put<uint64_t>(m.size());
  for (const auto& [k, v] : m) {
    w.put_string(k);
    w.put(v);
  }
  return w.take();
}

std::map<std::string, double> decode_metrics(const std::string& bytes) {
  ByteReader r(bytes);
  std::map<std::string, double> m;
  for (uint64_t n = r.get<uint64_t>(); n > 0; --n) {
    std::string k = r.get_string();
    m[k] = r.get<double>();
  }
  return m;
}

// The router's scores of a round: the groups' samples, then the greedy baselines.
std::vector<float> score_round(const RewardConfig& reward, const Tokenizer& tokenizer,
                               const std::vector<Prompt>& prompts, int64_t first_group,
                               const std::vector<Sample>& samples, const std::vector<Sample>& greedy) {
  BatchScorer scorer(reward, tokenizer);
  for (const auto& s : samples) scorer.add(prompts[s.group_index - first_group], s);
  for (const auto& s : greedy) scorer.add(prompts[s.group_index - first_group], s);
  return scorer.score();
}

// ReMax: each group's greedy response, scored after the `n_sampled` samples (r), is
// recorded as the group's baseline (index n, after its sampled responses), never trained.
void record_greedy_baselines(const std::vector<float>& r, size_t n_sampled, int64_t first_group, int64_t step,
                             int64_t n, std::vector<Sample>& greedy, RolloutBatch& out) {
  for (size_t g = 0; g < greedy.size(); ++g) {
    Sample& s = greedy[g];
    SLIMPI_CHECK(s.group_index == first_group + int64_t(g), "ReMax: greedy response {} is of group {}", g,
                 s.group_index);
    s.step = step;
    s.raw_reward = r[n_sampled + g];
    s.index = n;
    retire(s, SampleStatus::Baseline);
    out.unused.push_back(std::move(s));
  }
}

struct RoundFilter {
  const DynamicFilter& filter;
  int64_t step, n, want;  // the step, samples per group, groups the batch wants
};

// Each group of the round kept (until `kept` reaches want) or recorded: filtered, surplus,
// or (a group with an episode its environment failed) with the filtered ones. Returns the
// groups with a failed episode.
int64_t keep_groups(const RoundFilter& f, const std::vector<float>& r, std::vector<Sample>& samples, int& kept,
                    RolloutBatch& out) {
  const int64_t n = f.n;
  int64_t env_failed_groups = 0;
  for (size_t g = 0; g * n < samples.size(); ++g) {
    const std::vector<float> group_rewards(r.begin() + g * n, r.begin() + (g + 1) * n);
    const bool env_failed =
        any_episode_failed(samples.begin() + std::ptrdiff_t(g * n), samples.begin() + std::ptrdiff_t((g + 1) * n));
    const bool keep = !env_failed && f.filter.keep(group_rewards);
    const bool surplus = keep && kept >= f.want;
    if (!keep && !env_failed) ++out.groups_dropped;
    if (env_failed) ++env_failed_groups;
    if (keep && !surplus) ++kept;
    for (int64_t i = 0; i < n; ++i) {
      Sample s = std::move(samples[g * n + i]);
      s.step = f.step;
      s.raw_reward = r[g * n + i];
      if (keep && !surplus) {
        out.kept.push_back(std::move(s));
      } else {
        retire(s, keep ? SampleStatus::Surplus : SampleStatus::Filtered);  // (a failed episode stays EnvFailed)
        out.unused.push_back(std::move(s));
      }
    }
  }
  return env_failed_groups;
}

}  // namespace

StepPhases::StepPhases(RunContext& ctx, RunComponents& parts) : ctx_(ctx), parts_(parts) {
  if (ctx_.deck.get_bool("debug.train_only"))
    replay_ = std::make_unique<ReplaySource>(ctx_, parts_, ctx_.deck.get_string("debug.load_rollouts"));
}

StepPhases::~StepPhases() = default;

void StepPhases::begin_step() { step_ = StepState(); }

bool StepPhases::is_router() const { return ctx_.world->rank() == parts_.router_world_rank; }

void StepPhases::share_metrics(int root, const std::map<std::string, double>& values) {
  std::string bytes = ctx_.world->rank() == root ? encode_metrics(values) : std::string();
  broadcast_string(ctx_.world->world(), bytes, root);
  for (const auto& [k, v] : decode_metrics(bytes)) step_.metrics[k] = v;
}

void StepPhases::eval(int64_t step) {
  const int64_t interval = ctx_.deck.get_int("eval.interval");
  if (step == 0 || (interval > 0 && step % interval == 0)) run_eval(step);
}

void StepPhases::run_eval(int64_t row) {
  std::map<std::string, double> m;
  // SFT: the engine runs the trainer's weights (a gathered whole model under model
  // parallelism), changed since the last evaluation, so its prefix cache (KV computed
  // under the old ones) must go.
  if (!parts_.rl) {
    parts_.weight_route->push(row);
    if (parts_.rollout_side) parts_.rollout_side->set_weight_version(row);
  }
  if (parts_.rollout_side)
    m = parts_.rollout_side->evaluate(parts_.eval_prompts, parts_.configs.reward, ctx_.deck.get_int("eval.n_samples"),
                                      kEvalStream + uint64_t(row) * 2);
  share_metrics(parts_.router_world_rank, m);
  const double target = ctx_.deck.get_float("eval.stop_at_pass1");
  if (target > 0 && step_.metrics.count("eval/pass@1") && step_.metrics.at("eval/pass@1") >= target) {
    reached_target_ = true;
    reached_pass1_ = step_.metrics.at("eval/pass@1");
    log::info("eval/pass@1 = {:.3f} reached eval.stop_at_pass1 = {}: the run ends after this step",
              step_.metrics.at("eval/pass@1"), target);
  }
}

void StepPhases::generate_batch(int64_t step, RolloutBatch& out) {
  RolloutSide& side = *parts_.rollout_side;
  Stopwatch rounds_clock;
  const Deck& deck = ctx_.deck;
  const int64_t want = deck.get_int("rollout.rollout_batch_size");
  const int64_t per_round = deck.get_int("rollout.over_sampling_batch_size") > 0
                                ? deck.get_int("rollout.over_sampling_batch_size")
                                : want;
  const DynamicFilter& filter = dynamic_filters().get(deck.get_string("rollout.dynamic_filter"));
  const int64_t max_rounds = filter.is_identity() ? 1 : deck.get_int("rollout.max_sampling_rounds");
  const int64_t n = side.config().n_samples_per_prompt;
  // ReMax: each group's greedy response, generated beside it; its reward is the group's
  // baseline (postprocess_group_rewards); recorded, never trained.
  const bool greedy_baseline = parts_.configs.trainer.estimator->greedy_baseline();
  int kept = 0;
  int64_t env_failed_groups = 0;  // (router) groups left out for an episode their environment failed
  for (int64_t round = 0; round < max_rounds && kept < want; ++round) {
    // Draw the round's prompts, generate their groups, score them, filter the groups.
    const int64_t first_group = out.groups_generated;
    std::vector<Prompt> prompts = parts_.prompt_source->next(per_round);
    double tail_s = 0;
    std::vector<Sample> samples =
        side.generate(prompts, first_group, uint64_t(step), n, side.config().sampling, &out.engine_stats, &tail_s);
    out.tail_s = std::max(0.0, out.tail_s) + tail_s;
    std::vector<Sample> greedy;  // one per group, in group order
    if (greedy_baseline) {
      SamplingParams argmax = side.config().sampling;
      argmax.temperature = 0.0;
      greedy = side.generate(prompts, first_group, uint64_t(step), 1, argmax, &out.engine_stats);
    }
    out.groups_generated += per_round;
    ++out.rounds;
    if (side.is_router()) {
      Stopwatch clock;
      const std::vector<float> r = score_round(parts_.configs.reward, *parts_.tokenizer, prompts, first_group,
                                               samples, greedy);
      out.score_s += clock.seconds();
      record_greedy_baselines(r, samples.size(), first_group, step, n, greedy, out);
      const RoundFilter rf{filter, step, n, want};
      env_failed_groups += keep_groups(rf, r, samples, kept, out);
    }
    static const std::string kept_context = "[rollout] the router's count of kept groups";
    WaitGuard guard({&kept_context, "MPI_Bcast", 1, "i32", 0});
    MPI_Bcast(&kept, 1, MPI_INT, 0, ctx_.world->rollout());
  }
  if (parts_.teacher && parts_.configs.trainer.teacher_placement == "rollout") {  // the router scores the kept samples
    Stopwatch clock;
    score_with_teacher(*parts_.teacher, out.kept, teacher_scoring(parts_.configs.trainer, parts_.configs.model.vocab_size));
    out.teacher_s += clock.seconds();
  }
  out.generate_s += rounds_clock.seconds();
  step_.generation_s += rounds_clock.seconds();
  if (side.is_router() && kept < want && !said_short_batch_) {
    // Steps are counted from 1 in every line a person reads (the progress line's "step k/n").
    log::warn("step {}: {} of {} groups to train after {} round(s) of {} ({} dropped by the dynamic filter{}, {} with "
              "an episode the environment failed); training on those (rewards normalised per group). Said once: "
              "rollout/short_batch_groups in metrics.h5 counts every short batch",
              step + 1, kept, want, out.rounds, per_round, out.groups_dropped,
              filter.is_identity() ? ", which is off" : "", env_failed_groups);
    said_short_batch_ = true;
  }
}

void StepPhases::postprocess_group_rewards(RolloutBatch& batch) {
  // Group post-processing of the kept groups' rewards (per group, also in a short
  // batch: slime never trains one, and per group is what its normalisation means).
  if (!parts_.rollout_side || !parts_.rollout_side->is_router() || batch.kept.empty()) return;
  const Deck& deck = ctx_.deck;
  const int64_t n = parts_.rollout_side->config().n_samples_per_prompt;
  const RewardNormalization norm{!deck.get_bool("train.disable_rewards_normalization"),
                                 !deck.get_bool("train.disable_grpo_std_normalization")};
  std::vector<float> raw;
  for (const auto& s : batch.kept) raw.push_back(s.raw_reward);
  const AdvantageEstimator& estimator = *parts_.configs.trainer.estimator;
  std::vector<float> baselines;  // ReMax: each kept group's greedy reward
  if (estimator.greedy_baseline()) {
    std::map<int64_t, float> greedy;
    for (const auto& s : batch.unused)
      if (s.status == SampleStatus::Baseline) greedy[s.group_index] = s.raw_reward;
    for (size_t i = 0; i < batch.kept.size(); i += size_t(n)) {
      const auto it = greedy.find(batch.kept[i].group_index);
      SLIMPI_CHECK(it != greedy.end(), "ReMax: group {} of step {} has no greedy response",
                   batch.kept[i].group_index, batch.kept[i].step);
      baselines.push_back(it->second);
    }
  }
  const std::vector<float> rewards = postprocess_rewards(estimator, raw, n, norm, baselines);
  for (size_t i = 0; i < batch.kept.size(); ++i) batch.kept[i].reward = rewards[i];
}

void StepPhases::hand_out(int64_t step, RolloutBatch& batch, const std::map<std::string, double>& extra) {
  static const std::string waiting_for_rollouts = "[buffer] trainers waiting for the step's rollouts";
  idle_barrier(ctx_.world->world(), waiting_for_rollouts);
  if (replay_) {  // debug.train_only: the recorded samples of this step
    step_.batch = replay_->trainer_share(step);
    return;
  }
  const bool router = is_router();
  std::map<std::string, double> m;
  if (router) {
    const PromptSource& prompts = *parts_.prompt_source;
    m = rollout_metrics(batch, {step, parts_.rollout_side->config().n_samples_per_prompt,
                                ctx_.deck.get_int("rollout.rollout_batch_size"), prompts.n_skipped_lines(),
                                prompts.cursor(), prompts.epoch()});
    for (const auto& [k, v] : extra) m[k] = v;
  }
  share_metrics(parts_.router_world_rank, m);
  if (step_.metrics.count("rollout/short_batch_groups") && step_.metrics.at("rollout/short_batch_groups") > 0)
    ++n_short_batches_;
  // Every rank follows the router's prompt cursor (it drew as many rounds as needed).
  if (parts_.prompt_source) parts_.prompt_source->set_cursor(int64_t(step_.metrics.at("rollout/prompt_cursor")));
  if (ctx_.deck.get_bool("debug.rollout_only")) {
    if (router) step_.batch = std::move(batch.kept);  // logged as generated; nothing trains
    return;
  }
  step_.batch = scatter_samples(ctx_.world->world(), parts_.router_world_rank, parts_.trainer_world_ranks, batch.kept,
                                parts_.sample_block);
}

void StepPhases::train(int64_t step) {
  // Colocated ranks may give the engine's KV pool back to training (slime's sleep/wake):
  // the next rollout builds it again.
  if (parts_.rollout_side && parts_.trainer && parts_.rl && parts_.rollout_side->config().offload_between_phases)
    parts_.rollout_side->offload();
  if (!parts_.trainer) return;
  Trainer& trainer = *parts_.trainer;
  const Deck& deck = ctx_.deck;
  if (!parts_.rl) {
    const Comm& dp = parts_.model_parallel->data();
    std::vector<Sample> local = parts_.sft_data->batch(step, deck.get_int("train.global_batch_size"), dp.rank(),
                                                       dp.size());
    for (const auto& [k, v] : trainer.train_step(local)) step_.metrics[k] = v;
    return;
  }
  std::vector<Sample>& local = step_.batch;
  int64_t n_global = static_cast<int64_t>(local.size());
  {
    static const std::string context = "[train] samples of the step over the trainers";
    WaitGuard guard({&context, "MPI_Allreduce", 1, "i64"});
    MPI_Allreduce(MPI_IN_PLACE, &n_global, 1, MPI_INT64_T, MPI_SUM, ctx_.world->trainer());
  }
  n_global /= parts_.sample_block;  // every rank of a tensor × context × pipeline block holds the same samples
  if (n_global == 0) {
    log::warn("step {}: no samples to train on (every group was filtered out, or had an episode its environment failed)",
              step + 1);
    return;
  }
  int64_t n_steps = deck.get_int("train.num_steps_per_rollout");
  if (n_steps == 0) n_steps = std::max<int64_t>(1, n_global / deck.get_int("train.global_batch_size"));
  if (n_steps > n_global) {  // a short batch (the filter kept few groups): no empty optimizer step
    log::warn("step {}: {} samples for train.num_steps_per_rollout = {}: taking {} optimizer steps", step + 1, n_global,
              n_steps, n_global);
    n_steps = n_global;
  }
  // Reference and old log-probs, KL, advantages and their whitening: once per rollout.
  for (const auto& [k, v] : trainer.prepare_rollout(local, /*recompute_old=*/n_steps > 1)) step_.metrics[k] = v;
  // The optimizer steps (PPO: the critic's epochs and warm-up first).
  for (const auto& [k, v] : trainer.train_rollout(local, n_steps, step)) step_.metrics[k] = v;
  step_.metrics["perf/train_rss_mb"] = double(resident_bytes()) / double(1 << 20);  // after the optimizer steps
}

void StepPhases::append_rollouts(const std::vector<Sample>& untrained) {
  // rollouts.h5: every generated sample of the trained batch. First the trained ones,
  // each trainer appending its share with what training used (trainer order = training
  // order); then the router's filtered and surplus groups. One collective append; a
  // write that fails on one rank (a full disk) stops every rank here, cleanly.
  run_on_all_and_agree(ctx_.world->world(), "[record] writing " + rollouts_->path(), [&] {
    // Tensor, context and pipeline parallelism: a block's ranks hold the same samples; its
    // first records them.
    const bool records = !parts_.model_parallel || parts_.model_parallel->first_of_block();
    rollouts_->append(records ? step_.batch : std::vector<Sample>{}, untrained);
    rollouts_->flush();
  });
}

void StepPhases::follow_router_cursor(const std::string& context) {
  int64_t cursor = parts_.prompt_source->cursor();
  WaitGuard guard({&context, "MPI_Bcast", 1, "i64", parts_.router_world_rank});
  MPI_Bcast(&cursor, 1, MPI_INT64_T, parts_.router_world_rank, ctx_.world->world());
  parts_.prompt_source->set_cursor(cursor);
}

void StepPhases::push_weights(int64_t version, AsyncGenerator* async) {
  const WeightPush pushed = parts_.weight_route->push(version);
  if (!pushed.took_part) return;
  if (async) async->update_weights(pushed.version);  // between engine iterations; rollout.partial applies
  else if (parts_.rollout_side) parts_.rollout_side->set_weight_version(pushed.version);
  if (ctx_.world->rank() != 0 || !pushed.stats) return;
  const WeightSyncStats& s = *pushed.stats;
  step_.metrics["perf/weight_sync_bytes"] = double(s.bytes);
  step_.metrics["perf/weight_sync_gbps"] = double(s.bytes) / s.seconds / 1e9;
  if (pushed.delta) {
    step_.metrics["perf/weight_sync_density"] = s.density;  // changed elements / elements (1: a whole sync)
    step_.metrics["perf/weight_sync_anchor"] = s.anchor ? 1.0 : 0.0;
    step_.metrics["perf/weight_sync_resent"] = s.resent ? 1.0 : 0.0;
  }
}

}  // namespace slimpi
