#include "rollout/rollout_side.h"

#include <malloc.h>
#include <slimpi/error.h>

#include <algorithm>

#include "core/log.h"
#include "core/timer.h"
#include "kernels/counter_rng.h"
#include "reward/batch_scorer.h"
#include "env/environment.h"
#include "rollout/disaggregated_router.h"
#include "rollout/engine_group.h"
#include "rollout/episode_runner.h"
#include "rollout/evaluation.h"
#include "tokenizer/byte_tokenizer.h"

namespace slimpi {

RolloutSide::RolloutSide(const RolloutConfig& cfg, const Transformer& model, MPI_Comm engines, uint64_t run_seed,
                         MPI_Comm engine_group)
    : cfg_(cfg), model_(model), engines_(engines), run_seed_(run_seed), engine_group_(engine_group) {
  SLIMPI_CHECK((engines_ == MPI_COMM_NULL) == is_follower(),
               "rollout: an engine group's first rank joins the engines' communicator, its other ranks do not");
  if (!is_follower()) MPI_Comm_rank(engines_, &rank_);
}

RolloutSide::~RolloutSide() = default;

bool RolloutSide::is_follower() const { return model_.tensor_shard().rank > 0; }

std::vector<Sample> RolloutSide::generate(const std::vector<Prompt>& prompts, int64_t first_group, uint64_t stream,
                                          int64_t n_samples, const SamplingParams& params, EngineStats* stats,
                                          double* tail_s) {
  if (is_follower()) {  // the leader's forwards, until its router call is done
    follow();
    return {};
  }
  const Tokenizer& tok = *cfg_.tokenizer;
  std::vector<GenerationRequest> requests;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.group_index = first_group + static_cast<int64_t>(i);
    r.prompt = prompt_token_ids(tok, prompts[i]);
    r.n_samples = n_samples;
    r.params = params;
    r.seed = mix_seed(run_seed_, stream, uint64_t(r.group_index));
    requests.push_back(std::move(r));
  }
  Engine& engine = current_engine();
  const EngineStats before = engine.stats();
  Stopwatch clock;
  std::vector<double> done_at;  // seconds at which each group came back, in order
  auto on_progress = [&](const RouterProgress& p) {
    while (int64_t(done_at.size()) < p.groups_done) done_at.push_back(clock.seconds());
  };
  std::unique_ptr<EpisodeRunner> episodes;
  // (Prefill engines, rollout.prefill_ranks, run no episodes: they prefill the decode engines' contexts.)
  if (cfg_.env.enabled() && !engine.is_prefill_engine()) {
    if (!env_) {
      env_ = environments().get(cfg_.env.name)(cfg_.env, model_.config().vocab_size);
      // Said by the router, which is world rank 0 only when colocated: log::all, not info.
      if (is_router())
        log::all("rollout.environment = \"{}\"{}: {}", cfg_.env.name,
                 cfg_.env.name == "command" ? fmt::format(" ('{}')", cfg_.env.command) : "",
                 describe_env_info(env_->info()));
    }
    const EpisodeSettings settings{cfg_.env, cfg_.chat, params.max_new_tokens, stream};
    episodes = std::make_unique<EpisodeRunner>(engine, *env_, tok, settings, prompts, first_group);
  }
  EngineStats pd;  // prefill/decode disaggregation: this rank's transfer times and its pool's busy time
  std::vector<Sample> out = route_groups(engine, episodes.get(), cfg_.env.enabled(), engines_, cfg_.prefill_ranks,
                                         cfg_.engine.max_running, requests, on_progress, pd);
  if (tail_s && !done_at.empty()) {  // the last 10% of the groups: t_n - t_ceil(0.9 n)
    const size_t k90 = (9 * done_at.size() + 9) / 10;
    *tail_s = done_at.back() - done_at[k90 - 1];
  }
  engine.release_group();
  if (stats) {
    EngineStats mine = engine_->stats() - before;
    mine += pd;
    *stats += sum_engine_stats(mine, engines_);
  }
  return out;
}

double RolloutSide::follow() {
  SLIMPI_CHECK(is_follower(), "rollout: only an engine group's follower follows");
  if (!follower_) follower_ = std::make_unique<EngineFollower>(cfg_.engine, model_, engine_group_);
  Stopwatch clock;
  follower_->follow();
  return clock.seconds();
}

Engine& RolloutSide::current_engine() {
  if (!engine_) {
    int size = 1;
    MPI_Comm_size(engines_, &size);
    engine_ = std::make_unique<Engine>(engine_config_of_rank(cfg_.engine, rank_, size, cfg_.prefill_ranks), model_,
                                       engine_group_);
  }
  if (engine_->weight_version() != weight_version_) engine_->on_weights_updated(weight_version_);
  return *engine_;
}

StreamingRouter& RolloutSide::stream() {
  SLIMPI_CHECK(!is_follower(), "rollout: an engine group's follower has no stream of its own (it follows)");
  SLIMPI_CHECK(cfg_.prefill_ranks == 0, "rollout: prefill/decode disaggregation does not stream (train.async = "
               "\"full\" is refused with rollout.prefill_ranks)");
  if (stream_) return *stream_;
  Engine& engine = current_engine();
  if (cfg_.env.enabled()) {  // its own environment processes: an evaluation's episodes use env_
    stream_env_ = environments().get(cfg_.env.name)(cfg_.env, model_.config().vocab_size);
    const EpisodeSettings settings{cfg_.env, cfg_.chat, cfg_.sampling.max_new_tokens, kFullAsyncStream};
    stream_episodes_ = std::make_unique<EpisodeRunner>(engine, *stream_env_, *cfg_.tokenizer, settings, no_prompts_, 0);
  }
  stream_ = std::make_unique<StreamingRouter>(engine, stream_episodes_.get(), engines_, cfg_.engine.max_running,
                                              cfg_.sampling);
  return *stream_;
}

void RolloutSide::offload() {
  SLIMPI_CHECK(!stream_, "rollout: the engine cannot be offloaded while it streams (train.async = \"full\")");
  engine_.reset();
  follower_.reset();
  // The pool's pages go back to the OS (slimpi keeps freed memory in the process
  // otherwise, docs/architecture.md, threads and memory); on a GPU torch's caching allocator hands the freed blocks
  // to training's tensors.
  malloc_trim(0);
}

std::map<std::string, double> RolloutSide::evaluate(const std::vector<Prompt>& prompts, const RewardConfig& reward,
                                                    int64_t n_samples, uint64_t stream) {
  std::map<std::string, double> metrics;
  const Tokenizer& tok = *cfg_.tokenizer;
  auto score = [&](const std::vector<Sample>& samples) {
    BatchScorer scorer(reward, tok);
    for (const auto& s : samples) scorer.add(prompts[s.group_index], s);
    return scorer.score();
  };
  SamplingParams greedy = cfg_.sampling;
  greedy.temperature = 0.0;
  std::vector<Sample> g = generate(prompts, 0, stream, 1, greedy, nullptr);
  if (is_router()) {
    std::vector<float> r = score(g);
    double correct = 0, total = 0;
    for (float x : r) {
      correct += x >= 1.0f;
      total += x;
    }
    metrics["eval/pass@1"] = correct / double(r.size());
    metrics["eval/mean_reward"] = total / double(r.size());
    metrics["eval/n_prompts"] = double(r.size());
    if (cfg_.env.enabled()) {  // a failed episode scores 0: how many did, so that a 0 is read right
      const auto failed = std::count_if(g.begin(), g.end(), [](const Sample& s) { return s.status == SampleStatus::EnvFailed; });
      metrics["eval/env_failed"] = double(failed);
      if (failed > 0 && failed == std::ptrdiff_t(g.size()))
        log::warn("evaluation: all {} episodes failed in their environment (their reasons are in the log above): "
                  "eval/pass@1 and eval/mean_reward are 0 whatever the policy", failed);
    }
  }
  if (n_samples > 1) {
    std::vector<Sample> s = generate(prompts, 0, stream + 1, n_samples, cfg_.sampling, nullptr);
    if (is_router()) {
      std::vector<float> r = score(s);
      std::vector<int64_t> correct(prompts.size(), 0);
      for (size_t i = 0; i < s.size(); ++i) correct[s[i].group_index] += r[i] >= 1.0f;
      for (int64_t k = 1; k <= n_samples; k *= 2) {
        double sum = 0;
        for (int64_t c : correct) sum += pass_at_k(n_samples, c, k);
        metrics[fmt::format("eval/sampled_pass@{}", k)] = sum / double(prompts.size());
      }
    }
  }
  return metrics;
}

}  // namespace slimpi
