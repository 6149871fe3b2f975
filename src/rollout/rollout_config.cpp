#include "rollout/rollout_config.h"

#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <algorithm>

#include "core/log.h"
#include "model/model_config.h"
#include "model/tensor_shard.h"
#include "model/precision.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace slimpi {

at::ScalarType kv_cache_dtype(const Deck& deck, bool rollout_weights) {
  const std::string& cache = deck.get_string("rollout.kv_cache_dtype");
  if (cache == "auto") return rollout_weights ? rollout_weight_dtype(deck.get_string("rollout.precision")) : at::kFloat;
  return cache == "bf16" ? at::kBFloat16 : at::kFloat8_e4m3fn;
}

namespace {

// rollout.kv_cache_memory_gb as whole blocks of tokens: keys and values of every layer in
// the cache's dtype, plus an MoE model's routing trace (int16 per expert choice).
int64_t kv_tokens_in_memory(const Deck& deck, const ModelConfig& m, int64_t block_size, bool rollout_weights) {
  const double gb = deck.get_float("rollout.kv_cache_memory_gb");
  const at::ScalarType dtype = kv_cache_dtype(deck, rollout_weights);
  const int64_t element = int64_t(c10::elementSize(dtype));
  const int e = int(deck.get_int("rollout.tensor_parallel"));  // each rank of an engine caches its key/value heads
  // A speculating engine caches its draft (the first MTP depth) beside the trunk's layers
  // (a hybrid model's linear layers cache no token: their state is per sequence).
  const int64_t layers = m.n_layers - m.n_linear_layers() + (deck.get_string("rollout.speculative") == "mtp" ? 1 : 0);
  const KvCacheRow row = kv_cache_row(m, e);
  const int64_t per_token = row.rows * layers * row.heads * row.dim * element +
                            (m.n_experts > 0 ? 2 * m.n_moe_layers() * m.n_experts_per_tok : 0);
  // Hybrid models: rollout.max_running sequences' linear-layer states (fp32; each rank of
  // an engine holds its 1/e of the heads; a speculating engine a snapshot of each too:
  // rollout/engine.h, engine_state_slots) come first.
  const int64_t state_copies = deck.get_string("rollout.speculative") == "mtp" ? 2 : 1;
  const int64_t state_bytes = 4 * m.linear_state_size() / e * deck.get_int("rollout.max_running") * state_copies;
  const double budget = gb * double(int64_t(1) << 30) - double(state_bytes);
  if (budget < double(per_token * block_size)) {
    const double least_gb = double(state_bytes + per_token * block_size) / double(int64_t(1) << 30);
    if (state_bytes > 0)
      SLIMPI_FAIL_ALL("rollout.kv_cache_memory_gb = {} ({}) does not hold the linear layers' states of "
                      "rollout.max_running = {} sequences ({} bytes) and one block of tokens: it needs at least {:.3g}",
                      gb, deck.source("rollout.kv_cache_memory_gb"), deck.get_int("rollout.max_running"), state_bytes,
                      least_gb);
    SLIMPI_FAIL_ALL("rollout.kv_cache_memory_gb = {} ({}) does not hold one block of {} tokens ({} bytes): it needs at "
                    "least {:.3g}", gb, deck.source("rollout.kv_cache_memory_gb"), block_size, per_token * block_size,
                    least_gb);
  }
  const int64_t tokens = int64_t(budget / double(per_token)) / block_size * block_size;
  if (state_bytes > 0)
    log::info("rollout.kv_cache_memory_gb = {}: {} bytes hold the Gated DeltaNet states of rollout.max_running = {} "
              "sequences ({} linear layers{})", gb, state_bytes, deck.get_int("rollout.max_running"),
              m.n_linear_layers(), state_copies > 1 ? "; and a copy of each, speculative decoding's snapshots" : "");
  if (!deck.is_default("rollout.kv_cache_tokens"))
    SLIMPI_FAIL_ALL("rollout.kv_cache_memory_gb = {} ({}) and rollout.kv_cache_tokens = {} ({}) both size the KV "
                    "cache: set one", gb, deck.source("rollout.kv_cache_memory_gb"),
                    deck.get_int("rollout.kv_cache_tokens"), deck.source("rollout.kv_cache_tokens"));
  log::info("rollout.kv_cache_memory_gb = {}: {} tokens per engine ({} bytes a token on each of its ranks: {} layers "
            "x {} in {})", gb, tokens, per_token, layers,
            row.rows == 2 ? fmt::format("{} key/value heads x {} x 2", row.heads, row.dim)
                          : fmt::format("one latent row of {} (keys and values)", row.dim),
            dtype == at::kFloat8_e4m3fn ? "e4m3" : dtype == at::kBFloat16 ? "bf16" : "fp32");
  return tokens;
}

// rollout.speculative and its keys, checked against the model and the layout.
void read_speculation(const Deck& deck, const ModelConfig& model, RolloutConfig& c) {
  const std::string& mode = deck.get_string("rollout.speculative");
  const int64_t steps = deck.get_int("rollout.spec_num_steps"), draft_tokens = deck.get_int("rollout.spec_num_draft_tokens");
  if (mode == "none") return;
  auto at = [&](const char* key) { return fmt::format("{} ({})", key, deck.source(key)); };
  if (model.mtp_num_layers < 1)
    SLIMPI_FAIL_ALL("rollout.speculative = \"{}\" ({}) drafts with the policy's multi-token-prediction layers, but "
                    "model.mtp_num_layers = 0 ({}): give the model MTP layers (a model without them gets fresh ones) "
                    "or set rollout.speculative = \"none\"", mode, deck.source("rollout.speculative"),
                    deck.source("model.mtp_num_layers"));
  if (draft_tokens != 0 && draft_tokens != steps + 1)
    SLIMPI_FAIL_ALL("rollout.spec_num_draft_tokens = {} ({}) must be rollout.spec_num_steps + 1 = {} (or 0): drafts "
                    "are chains, one token per step, verified with the token before them (tree drafts are not "
                    "implemented)", draft_tokens, deck.source("rollout.spec_num_draft_tokens"), steps + 1);
  if (deck.get_int("rollout.tensor_parallel") > 1)
    SLIMPI_FAIL_ALL("rollout.speculative = \"{}\" ({}) with {} > 1: speculative decoding in tensor-parallel engines "
                    "is not implemented", mode, deck.source("rollout.speculative"), at("rollout.tensor_parallel"));
  c.engine.spec_steps = steps;
  c.engine.spec_max_running = deck.get_int("rollout.spec_max_running");
}

// rollout.prefill_ranks against the other [rollout] keys (the layout and train.async are
// checked where the engines are counted: check_run_deck, slimpi generate).
void read_disaggregation(const Deck& deck, RolloutConfig& c) {
  c.prefill_ranks = deck.get_int("rollout.prefill_ranks");
  if (c.prefill_ranks == 0) return;
  const std::string why = fmt::format("rollout.prefill_ranks = {} ({}) splits the engines into prefill and decode "
                                      "pools", c.prefill_ranks, deck.source("rollout.prefill_ranks"));
  auto refuse = [&](const char* key, const std::string& value, const char* what) {
    SLIMPI_FAIL_ALL("{}; with {} = {} ({}) {}: not implemented", why, key, value, deck.source(key), what);
  };
  if (deck.get_int("rollout.tensor_parallel") > 1)
    refuse("rollout.tensor_parallel", std::to_string(deck.get_int("rollout.tensor_parallel")),
           "the engines are tensor-parallel groups, whose KV shards would move between groups");
  if (deck.get_string("rollout.speculative") != "none")
    refuse("rollout.speculative", "\"" + deck.get_string("rollout.speculative") + "\"",
           "a decode engine drafts with an MTP cache layer that the prefill engine does not compute");
}

}  // namespace

namespace {

// What the engines' sizes must hold: a group decodes at once on one engine, every running
// sequence decodes a token an iteration, the shortest prompt and its response fit the
// context and the KV cache.
void check_engine_limits(const RolloutConfig& c, const Deck& deck) {
  if (c.n_samples_per_prompt > c.engine.max_running)
    SLIMPI_FAIL_ALL("rollout.n_samples_per_prompt = {} ({}) exceeds rollout.max_running = {} ({}): a group decodes "
                    "at once on one engine",
                    c.n_samples_per_prompt, deck.source("rollout.n_samples_per_prompt"), c.engine.max_running,
                    deck.source("rollout.max_running"));
  if (c.engine.max_batch_tokens < c.engine.max_running)
    SLIMPI_FAIL_ALL("rollout.max_batch_tokens = {} ({}) must be at least rollout.max_running = {} ({}): every "
                    "running sequence decodes one token per iteration",
                    c.engine.max_batch_tokens, deck.source("rollout.max_batch_tokens"), c.engine.max_running,
                    deck.source("rollout.max_running"));
  const int64_t eval_samples = deck.get_int("eval.n_samples");
  if (!deck.get_string("eval.path").empty() && eval_samples > c.engine.max_running)
    SLIMPI_FAIL_ALL("eval.n_samples = {} ({}) exceeds rollout.max_running = {} ({}): an eval group decodes at once "
                    "on one engine",
                    eval_samples, deck.source("eval.n_samples"), c.engine.max_running, deck.source("rollout.max_running"));
  const int64_t max_seq_len = deck.get_int("model.max_seq_len");
  const bool generates = deck.get_string("train.mode") == "rl" || !deck.get_string("eval.path").empty();
  if (generates && c.sampling.max_new_tokens + 2 > max_seq_len)
    SLIMPI_FAIL_ALL("rollout.max_new_tokens = {} ({}) leaves no room for a prompt in model.max_seq_len = {} ({}): "
                    "BOS, at least one prompt token and the response must fit",
                    c.sampling.max_new_tokens, deck.source("rollout.max_new_tokens"), max_seq_len,
                    deck.source("model.max_seq_len"));
  // The smallest group (a 2-token prompt) must fit the cache: one response of
  // max_new_tokens, and a block per sample for the forked partial prompt block.
  const int64_t n_blocks = c.engine.kv_cache_tokens / c.engine.block_size;
  const int64_t need = std::max((2 + c.sampling.max_new_tokens + c.engine.block_size - 1) / c.engine.block_size,
                                c.n_samples_per_prompt);
  if (generates && need > n_blocks)
    SLIMPI_FAIL_ALL("rollout.kv_cache_tokens = {} ({}{}) holds {} blocks of rollout.block_size = {}; even the "
                    "shortest prompt needs {} (rollout.max_new_tokens = {}, rollout.n_samples_per_prompt = {})",
                    c.engine.kv_cache_tokens, deck.source("rollout.kv_cache_tokens"),
                    deck.get_float("rollout.kv_cache_memory_gb") > 0 ? "; from rollout.kv_cache_memory_gb" : "",
                    n_blocks, c.engine.block_size,
                    need, c.sampling.max_new_tokens, c.n_samples_per_prompt);
  if (c.engine.kv_cache_tokens < c.engine.block_size)
    SLIMPI_FAIL_ALL("rollout.kv_cache_tokens = {} is smaller than one block (rollout.block_size = {})",
                    c.engine.kv_cache_tokens, c.engine.block_size);
}

}  // namespace

RolloutConfig RolloutConfig::from_deck(const Deck& deck, const ModelConfig& model, bool rollout_weights) {
  RolloutConfig c;
  c.engine.block_size = deck.get_int("rollout.block_size");
  c.engine.kv_cache_tokens = deck.get_float("rollout.kv_cache_memory_gb") > 0
                                 ? kv_tokens_in_memory(deck, model, c.engine.block_size, rollout_weights)
                                 : deck.get_int("rollout.kv_cache_tokens");
  c.offload_between_phases = deck.get_bool("rollout.offload_between_phases");
  c.engine.max_running = deck.get_int("rollout.max_running");
  c.engine.max_batch_tokens = deck.get_int("rollout.max_batch_tokens");
  c.engine.prefix_cache = deck.get_bool("rollout.prefix_cache");
  if (model.is_hybrid() && c.engine.prefix_cache) {
    // A Gated DeltaNet state is the whole prefix's: a cached block alone cannot restart a
    // sequence (rollout/engine.h). Off, and said; asked for, an error.
    if (!deck.is_default("rollout.prefix_cache"))
      SLIMPI_FAIL_ALL("rollout.prefix_cache = true ({}) with a hybrid linear-attention model "
                      "(model.full_attention_interval = {}): its linear layers' state is not kept per cached prefix, "
                      "so the prefix cache is not available; set rollout.prefix_cache = false",
                      deck.source("rollout.prefix_cache"), model.full_attention_interval);
    c.engine.prefix_cache = false;
    log::info("rollout.prefix_cache: off for a hybrid linear-attention model (model.full_attention_interval = {}): "
              "every prompt is prefilled whole", model.full_attention_interval);
  }
  c.engine.chunked_prefill_tokens = deck.get_int("rollout.chunked_prefill_tokens");
  c.engine.cache_responses = deck.get_bool("rollout.cache_responses");
  // "auto" stays the engine model's dtype (an SFT evaluation engine runs the fp32 policy).
  if (deck.get_string("rollout.kv_cache_dtype") != "auto") c.engine.kv_cache_dtype = kv_cache_dtype(deck, rollout_weights);
  if (model.is_hybrid() && c.engine.cache_responses)
    SLIMPI_FAIL_ALL("rollout.cache_responses = true ({}) stores responses in the prefix cache, which a hybrid "
                    "linear-attention model (model.full_attention_interval = {}) runs without: drop the key",
                    deck.source("rollout.cache_responses"), model.full_attention_interval);
  if (c.engine.cache_responses && !c.engine.prefix_cache)
    SLIMPI_FAIL_ALL("rollout.cache_responses = true ({}) stores responses in the prefix cache, but "
                    "rollout.prefix_cache = false ({}): turn the prefix cache on or drop the key",
                    deck.source("rollout.cache_responses"), deck.source("rollout.prefix_cache"));
  c.sampling.temperature = deck.get_float("rollout.temperature");
  c.sampling.top_k = deck.get_int("rollout.top_k");
  c.sampling.top_p = deck.get_float("rollout.top_p");
  c.sampling.max_new_tokens = deck.get_int("rollout.max_new_tokens");
  c.sampling.stop_strings = deck.get_strings("rollout.stop_strings");
  c.tokenizer = make_tokenizer(deck);
  c.engine.tokenizer = c.tokenizer;
  c.sampling.stop_token_ids = c.tokenizer->stop_ids();
  // A chat template's turns end with a marker; where the vocabulary has it as one token,
  // a generation stops there too (a base model's EOS is often <|endoftext|> alone).
  const ChatFormat chat = ChatFormat::from_deck(deck, *c.tokenizer);
  c.chat = chat;
  c.env = EnvConfig::from_deck(deck);
  c.env.chat = chat;
  // Episodes continue their sequences turn after turn: a finished turn's blocks enter the
  // prefix cache, so the next turn re-uses its KV instead of recomputing it.
  if (c.env.enabled() && c.engine.prefix_cache) c.engine.cache_responses = true;
  if (chat.enabled()) {
    for (const std::string& end : chat.turn_ends()) {
      const std::vector<int64_t> marker = c.tokenizer->encode_text(end);
      auto& stops = c.sampling.stop_token_ids;
      if (marker.size() == 1 && std::find(stops.begin(), stops.end(), marker[0]) == stops.end()) {
        stops.push_back(marker[0]);
        log::info("data.chat_template = {}: {} (id {}) ends a generation too", chat_template_name(chat.chat_template),
                  end, marker[0]);
      }
    }
  }
  c.n_samples_per_prompt = deck.get_int("rollout.n_samples_per_prompt");
  check_engine_limits(c, deck);
  read_speculation(deck, model, c);
  read_disaggregation(deck, c);
  if (c.offload_between_phases && deck.get_string("parallel.placement") != "colocate")
    SLIMPI_FAIL_ALL("rollout.offload_between_phases = true ({}) frees the engines' KV cache for training on the "
                    "same ranks, but parallel.placement = \"{}\" ({}) keeps rollout ranks apart: use "
                    "parallel.placement = \"colocate\" or drop the key",
                    deck.source("rollout.offload_between_phases"), deck.get_string("parallel.placement"),
                    deck.source("parallel.placement"));
  return c;
}

}  // namespace slimpi
