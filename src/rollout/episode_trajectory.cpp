// EpisodeRunner, the trajectory's views (rollout/episode_runner.h): an episode is one
// token sequence (the trajectory), but a trajectory split by new_context runs its latest
// context in the engine as a sequence of its own. turn_work makes that view of it for
// the engine, whole_trajectory maps a turn the engine returns back; context_tokens
// renders a reply's messages; append_observation extends the trajectory.
#include <slimpi/error.h>

#include <algorithm>
#include <utility>

#include "kernels/counter_rng.h"
#include "rollout/episode.h"
#include "rollout/episode_runner.h"

namespace slimpi {

int64_t EpisodeRunner::context_opened(const Sample& s) {
  // The context's opening tokens are the environment's (loss mask 0) up to its first model
  // token; until the model takes its first turn there, all of the trajectory after it.
  int64_t t = s.context_starts.back();
  while (t < int64_t(s.loss_mask.size()) && s.loss_mask[size_t(t)] == 0.0f) ++t;
  return t;
}

bool EpisodeRunner::opens_context(const Sample& s) {
  const int64_t from = s.context_starts.empty() ? 0 : s.context_starts.back();
  return std::none_of(s.loss_mask.begin() + std::min<int64_t>(from, int64_t(s.loss_mask.size())), s.loss_mask.end(),
                      [](float m) { return m != 0.0f; });
}

bool EpisodeRunner::prefilled_elsewhere(const Episode& e) const {
  if (!engine_.caches_prefixes()) return true;
  const size_t latest = e.sample.context_starts.size();  // (context k >= 1 begins at context_starts[k - 1])
  const bool resumed = latest < e.continued_from.size() && e.continued_from[latest] >= 0;
  return opens_context(e.sample) && !resumed;
}

std::vector<int64_t> EpisodeRunner::context_tokens(const EnvReply& reply) const {
  std::vector<int64_t> context;
  if (!reply.messages.empty()) {
    std::string text;
    if (settings_.chat.enabled()) {
      text = render_chat(reply.messages, settings_.chat, /*add_generation_prompt=*/true);
      context = tokenizer_.encode_chat(text);
    } else {
      for (const ChatMessage& m : reply.messages) text += m.content + "\n";
      context = tokenizer_.encode_prompt(text);
    }
  }
  context.insert(context.end(), reply.token_ids.begin(), reply.token_ids.end());
  return context;
}

Sample EpisodeRunner::whole_trajectory(const Episode& e, Sample&& turn) const {
  const Sample& s = e.sample;
  if (s.context_starts.empty()) return std::move(turn);
  // turn: the engine's sequence of the latest context, its prompt the context's opening
  // tokens (up to response offset `start` in the trajectory), its response what followed.
  const int64_t start = s.context_starts.back() + turn.prompt_length;
  SLIMPI_CHECK(start == context_opened(s) && start + turn.response_length() >= e.turn_start,
               "episodes: {}: the engine returned a context opened at response token {} (the trajectory's at {}) of "
               "{} response tokens, its turn begun at {}", e.id, start, context_opened(s), turn.response_length(),
               e.turn_start);
  Sample out = std::move(turn);
  std::vector<int64_t> tokens(s.tokens.begin(), s.tokens.begin() + s.prompt_length + s.context_starts.back());
  tokens.insert(tokens.end(), out.tokens.begin(), out.tokens.end());
  out.tokens = std::move(tokens);
  out.prompt_length = s.prompt_length;
  auto before = [&](const auto& field, auto& view) {  // the trajectory's entries before the turn, then the view's
    using V = typename std::decay_t<decltype(view)>::value_type;
    std::vector<V> whole(field.begin(), field.begin() + start);
    whole.insert(whole.end(), view.begin(), view.end());
    view = std::move(whole);
  };
  before(s.rollout_log_probs, out.rollout_log_probs);
  before(s.weight_versions, out.weight_versions);
  if (!out.sampling_support.empty() || !s.sampling_support.empty()) {
    if (out.sampling_support.empty()) out.sampling_support.assign(size_t(out.response_length() - start), 0);
    const std::vector<int32_t> earlier =
        s.sampling_support.empty() ? std::vector<int32_t>(size_t(start), 0) : s.sampling_support;
    before(earlier, out.sampling_support);
  }
  out.routing.clear();  // a split trajectory carries no routing trace (train/packed_batch.h)
  out.context_starts = s.context_starts;
  return out;
}

int64_t EpisodeRunner::response_budget(int64_t prompt_length) const {
  const int64_t cache_tokens = engine_.n_blocks() * engine_.block_size();
  return std::min({settings_.env.max_total_tokens, engine_.max_seq_len() - prompt_length, cache_tokens - prompt_length});
}

WorkItem EpisodeRunner::turn_work(const Episode& e, int64_t start, int64_t limit) const {
  WorkItem w;
  w.request = e.request;
  w.partial = e.sample;
  w.request.params.max_new_tokens = limit;
  w.request.stop_strings_from = start;
  const std::vector<int64_t>& contexts = e.sample.context_starts;
  if (contexts.empty()) return w;
  // A later context: the engine runs it as a sequence of its own, the context's opening
  // tokens its prompt and what followed them its response (as the first context's
  // prompt and response), sampling under the context's own seed.
  const Sample& s = e.sample;
  const int64_t opened = context_opened(s);
  Sample& v = w.partial;
  v.tokens.assign(s.tokens.begin() + s.prompt_length + contexts.back(), s.tokens.end());
  v.prompt_length = opened - contexts.back();
  v.rollout_log_probs.assign(s.rollout_log_probs.begin() + opened, s.rollout_log_probs.end());
  v.weight_versions.assign(s.weight_versions.begin() + opened, s.weight_versions.end());
  v.sampling_support = s.sampling_support.empty()
                           ? std::vector<int32_t>()
                           : std::vector<int32_t>(s.sampling_support.begin() + opened, s.sampling_support.end());
  v.loss_mask.clear();
  v.routing.clear();
  v.context_starts.clear();
  w.request.prompt = v.prompt();
  w.request.seed = mix_seed(e.request.seed, uint64_t(contexts.size()), 0x636f6e74657874ULL);
  w.request.params.max_new_tokens = limit - opened;
  w.request.stop_strings_from = start - opened;
  return w;
}

void EpisodeRunner::append_observation(Episode& e, const std::vector<int64_t>& observation, bool new_context) {
  Sample& s = e.sample;
  const int64_t n = int64_t(observation.size()), r = s.response_length();
  s.tokens.insert(s.tokens.end(), observation.begin(), observation.end());
  s.rollout_log_probs.resize(size_t(r + n), 0.0f);
  s.sampling_support.resize(size_t(r + n), 0);
  s.weight_versions.resize(size_t(r + n), engine_.weight_version());
  if (e.replay)  // the weights it was appended under
    std::copy(e.replay->recorded.weight_versions.begin() + r, e.replay->recorded.weight_versions.begin() + r + n,
              s.weight_versions.begin() + r);
  s.loss_mask.resize(size_t(r + n), 0.0f);
  if (new_context) {
    // The context left behind keeps its transcript, for a reply that resumes it (not one
    // whose history the template rewrote: that transcript took the refused messages).
    const size_t left = s.context_starts.size();
    e.left_transcripts.resize(left + 2);
    e.left_transcripts[left] = std::exchange(e.rewrote, false) ? std::string() : e.transcript->save();
    e.continued_from.resize(left + 2, -1);
    const int64_t resumed = std::exchange(e.resuming, -1);
    e.continued_from[left + 1] = resumed;
    if (resumed >= 0) e.left_transcripts[size_t(resumed)].clear();  // continued: never resumed again
    s.context_starts.push_back(r);
    s.routing.clear();  // a split trajectory carries no routing trace (train/packed_batch.h)
    e.transcript = e.resumed_transcript ? std::move(e.resumed_transcript) : std::make_unique<ChatTranscript>(settings_.chat);
  }
}

std::vector<int64_t> EpisodeRunner::context_of(const Sample& s, int64_t k) {
  const int64_t begin = k == 0 ? 0 : s.prompt_length + s.context_starts[size_t(k - 1)];
  return {s.tokens.begin() + begin, s.tokens.begin() + begin + context_length(s, k)};
}

int64_t EpisodeRunner::context_length(const Sample& s, int64_t k) {
  const auto& starts = s.context_starts;
  const int64_t begin = k == 0 ? -s.prompt_length : starts[size_t(k - 1)];  // response offsets
  const int64_t end = k == int64_t(starts.size()) ? s.response_length() : starts[size_t(k)];
  return end - begin;
}

int64_t EpisodeRunner::copied_tokens(const Episode& e) {
  int64_t n = 0;
  for (int64_t p : e.continued_from)
    if (p >= 0) n += context_length(e.sample, p);
  return n;
}

}  // namespace slimpi
