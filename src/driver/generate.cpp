#include "model/precision.h"
#include "driver/generate.h"
#include "driver/check_run_deck.h"
#include "driver/run_components.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>
#include <slimpi/sample.h>
#include <unistd.h>

#include <cstdio>

#include "buffer/rollout_batch.h"
#include "data/prompt_source.h"
#include "core/log.h"
#include "core/timer.h"
#include "io/metrics_log.h"
#include "io/rollout_log.h"
#include "io/tensor_io.h"
#include "kernels/counter_rng.h"
#include "sync/engine_weights.h"
#include "rollout/rollout_config.h"
#include "env/environment.h"
#include "rollout/episode_runner.h"
#include "rollout/disaggregated_router.h"
#include "rollout/router.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace slimpi {

namespace {

// The prompts of data.path (no label needed).
std::vector<Prompt> generation_prompts(const Deck& deck, const RolloutConfig& rc, const ModelConfig& mc) {
  PromptSourceSpec spec = PromptSourceSpec::from_deck(deck, deck.get_string("data.path"), rc.tokenizer);
  spec.skip_bad_lines = deck.get_bool("data.skip_bad_lines");
  spec.label_optional = true;
  spec.max_prompt_tokens = mc.max_seq_len - rc.sampling.max_new_tokens;
  return PromptSource(spec, static_cast<uint64_t>(deck.get_int("run.seed"))).records();
}

// One request per prompt, seeds from the run seed.
std::vector<GenerationRequest> generation_requests(const std::vector<Prompt>& prompts, const RolloutConfig& rc,
                                                   uint64_t seed) {
  std::vector<GenerationRequest> requests;
  for (const Prompt& rec : prompts) {
    GenerationRequest r;
    r.group_index = static_cast<int64_t>(requests.size());
    r.prompt = prompt_token_ids(*rc.tokenizer, rec);
    r.n_samples = rc.n_samples_per_prompt;
    r.params = rc.sampling;
    r.seed = mix_seed(seed, 0, uint64_t(r.group_index));
    requests.push_back(std::move(r));
  }
  return requests;
}

// Engine counters summed over ranks (`st`); response statistics from rank 0's samples.
std::map<std::string, double> generation_metrics(const std::vector<Sample>& samples, const EngineStats& st,
                                                 double seconds) {
  std::map<std::string, double> row;
  add_response_metrics(samples, row);
  row["rollout/n_samples"] = double(samples.size());
  add_engine_metrics(st, row);
  add_episode_metrics(samples, {}, row);
  row["perf/rollout_time"] = seconds;
  row["perf/rollout_tokens_per_s"] = double(st.generated_tokens) / seconds;
  return row;
}

// The progress line of a generate call: rewritten in place on a terminal, else every
// tenth of the groups as a log line.
std::function<void(const RouterProgress&)> progress_printer(const Stopwatch& clock) {
  const bool tty = isatty(fileno(stdout));
  return [&clock, tty, last_reported = int64_t(-1)](const RouterProgress& p) mutable {
    const int64_t percent = 100 * p.groups_done / std::max<int64_t>(1, p.groups_total);
    const std::string line = fmt::format("generate: groups {}/{}  tokens {}  {:.0f} tokens/s", p.groups_done,
                                         p.groups_total, p.tokens_generated, p.tokens_generated / clock.seconds());
    if (tty) {
      std::printf("\r%s", line.c_str());
      std::fflush(stdout);
      if (p.groups_done == p.groups_total) std::printf("\n");
    } else if (percent / 10 != last_reported / 10 || p.groups_done == p.groups_total) {
      log::info("{}", line);
    }
    last_reported = percent;
  };
}

// The call's summary lines.
void describe_generation(size_t n_samples, double seconds, const EngineStats& st, std::map<std::string, double>& row,
                         int64_t prefill_ranks, const std::string& run_dir) {
  log::info("generate: {} samples in {:.2f} s, {:.0f} tokens/s; prefill computed {} of {} prompt tokens served "
            "({:.1f}x sharing), {} preemptions; rollouts in {}/rollouts.h5",
            n_samples, seconds, row["perf/rollout_tokens_per_s"], st.prefill_tokens_computed,
            st.prompt_tokens_served, double(st.prompt_tokens_served) / std::max<double>(1.0, st.prefill_tokens_computed),
            st.preemptions, run_dir);
  log::info("generate: {} engine iterations ({:.1f} tokens a forward on average), {:.2f} s in forwards, {:.2f} s "
            "sampling (summed over engines)",
            st.iterations, double(st.forward_tokens) / std::max<double>(1.0, double(st.iterations)), st.forward_s,
            st.sample_s);
  if (prefill_ranks > 0)
    log::info("generate: {} prefill engine(s) sent {} prompt positions ({:.1f} MB of KV) to the decode engines; busy "
              "{:.0f}% (prefill) and {:.0f}% (decode) of the call", prefill_ranks, st.kv_sent_tokens,
              double(st.kv_sent_bytes) / 1e6, 100 * row["rollout/pd_prefill_busy"], 100 * row["rollout/pd_decode_busy"]);
}

}  // namespace

int run_generate(RunContext& ctx) {
  const Deck& deck = ctx.deck;
  if (deck.get_string("data.path").empty())
    SLIMPI_FAIL_ALL("slimpi generate needs prompts: set data.path (JSONL, prompt text under data.input_key)");
  ModelConfig mc = ModelConfig::from_deck(deck);
  check_exact_on_policy(deck, /*trainer_scores_engines=*/false);
  RolloutConfig rc = RolloutConfig::from_deck(deck, mc, /*rollout_weights=*/true);
  rc.env.run_dir = ctx.run_dir;
  const Tokenizer& tok = *rc.tokenizer;
  log::info("tokenizer: {}", tok.describe());
  if (const std::string note = describe_chat_template_choice(ctx.deck, tok); !note.empty()) log::info("{}", note);
  // rollout.prefill_ranks: the last ranks prefill, the others decode (rollout/disaggregated_router.h).
  if (rc.prefill_ranks >= ctx.world->size())
    SLIMPI_FAIL_ALL("rollout.prefill_ranks = {} ({}) leaves no decode engine among the job's {} ranks: use fewer "
                    "prefill ranks or more ranks", rc.prefill_ranks, deck.source("rollout.prefill_ranks"),
                    ctx.world->size());
  const uint64_t seed = static_cast<uint64_t>(deck.get_int("run.seed"));
  const std::vector<Prompt> prompts = generation_prompts(deck, rc, mc);
  const std::vector<GenerationRequest> requests = generation_requests(prompts, rc, seed);

  const at::Device device = ctx.device.use_cuda ? at::Device(at::kCUDA, ctx.device.gpu) : at::Device(at::kCPU);
  const std::string& precision = deck.get_string("rollout.precision");
  Transformer model(mc, seed, device, rollout_weight_dtype(precision));
  const std::string& init_from = deck.get_string("model.init_from");
  load_engine_weights(model, precision == "fp8", seed, init_from);  // fp8: through FP8 blocks, as a sync sends them
  log::info("generate: {} prompts x {} samples on {} engine(s); policy {} parameters from {}", requests.size(),
            rc.n_samples_per_prompt, ctx.world->size(), model.n_params(),
            init_from.empty() ? "the seeded init" : init_from);

  Engine engine(engine_config_of_rank(rc.engine, ctx.world->rank(), ctx.world->size(), rc.prefill_ranks), model);
  // rollout.environment: every sample is a multi-turn episode (rollout/episode_runner.h);
  // the environment's processes start before the clock.
  std::unique_ptr<Environment> env;
  std::unique_ptr<EpisodeRunner> episodes;
  if (rc.env.enabled() && !engine.is_prefill_engine()) {  // (prefill engines run no episodes)
    env = environments().get(rc.env.name)(rc.env, mc.vocab_size);
    episodes = std::make_unique<EpisodeRunner>(engine, *env, tok, EpisodeSettings{rc.env, rc.chat, rc.sampling.max_new_tokens, 0},
                                               prompts, 0);
  }
  Stopwatch clock;
  auto progress = progress_printer(clock);
  EngineStats pd;  // disaggregation: this rank's transfer times and its pool's busy time
  std::vector<Sample> samples = route_groups(engine, episodes.get(), rc.env.enabled(), ctx.world->world(),
                                            rc.prefill_ranks, rc.engine.max_running, requests, progress, pd);
  episodes.reset();
  const double seconds = clock.seconds();

  // rollouts.h5: rank 0 holds every sample, in group order.
  const std::string deck_text = deck.to_toml();
  RolloutLog rollouts = RolloutLog::create(ctx.run_dir + "/rollouts.h5", ctx.world->world(), deck_text);
  rollouts.append(samples);
  rollouts.flush();

  EngineStats mine = engine.stats();
  mine += pd;
  const EngineStats st = sum_engine_stats(mine, ctx.world->world());
  std::map<std::string, double> row = generation_metrics(samples, st, seconds);
  MetricsLog metrics(ctx.run_dir, ctx.world->world(), deck_text);
  metrics.log_step(0, row);
  describe_generation(samples.size(), seconds, st, row, rc.prefill_ranks, ctx.run_dir);
  return 0;
}

}  // namespace slimpi
