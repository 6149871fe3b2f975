// What the rollout engine is asked for and what it hands back.
#pragma once

#include <slimpi/sample.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/prompt_source.h"

namespace slimpi {

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // 1 = off
  int64_t max_new_tokens = 64;
  std::vector<int64_t> stop_token_ids;    // e.g. the tokenizer's EOS
  std::vector<std::string> stop_strings;  // matched on the decoded response
};

// One prompt group: n_samples responses to one prompt.
struct GenerationRequest {
  int64_t group_index = 0;
  std::vector<int64_t> prompt;  // token ids, non-empty
  int64_t n_samples = 1;
  SamplingParams params;
  uint64_t seed = 0;  // the group's stream: mix_seed(run seed, step, group_index)
  // Stop strings are matched on the response from this position on (a multi-turn
  // episode: its current turn, so that no earlier turn or observation completes one).
  int64_t stop_strings_from = 0;
};

// Rollout work that can leave one engine and enter another (train.async = "full"): a
// group not started yet (partial.tokens empty: n_samples responses to request.prompt),
// or one sample of a started group with its response so far (partial.index = the
// sample; tokens = prompt + response, with its log-probs, supports and weight
// versions), continued from its next position. Its KV is recomputed where it lands.
// With rollout.environment an item is a group of episodes, or one episode with its
// trajectory so far in `partial` (tokens from its reset's context on, loss mask and
// counters), its turns in `episode`, and the prompt record its reset needs in `record`
// (rollout/episode_runner.h replays it into a fresh environment).
struct WorkItem {
  GenerationRequest request;
  Sample partial;
  std::optional<Prompt> record;  // episodes: the group's prompt record (text, label, metadata)
  // An episode's model turns so far, as response offsets: turn k is [turn_starts[k],
  // turn_ends[k]), sent to the environment as a step; turn_stopped[k] says it ended on a
  // stop token or string (finish "stop") rather than its token limit ("length").
  // open_turn: where the turn still being sampled began (-1: none, the episode waits
  // for the environment). Empty, -1: the episode has not had its first observation.
  // With an environment that takes snapshots (env/environment.h), env_snapshot is its
  // state after the last reply the episode took ("": none), with the episode's chat
  // transcript (ChatTranscript::save) and its rewards so far: enough to restore it.
  struct EpisodeTurns {
    std::vector<int64_t> turn_starts, turn_ends;
    std::vector<int8_t> turn_stopped;
    int64_t open_turn = -1;
    std::string env_snapshot, transcript;
    // With a snapshot: the transcripts of the contexts it left and the context each continues
    // (rollout/episode.h), so that it may resume its threads after the restore.
    std::vector<std::string> left_transcripts;
    std::vector<int64_t> continued_from;
    double reward_sum = 0, last_reward = 0;
    bool empty() const { return turn_ends.empty() && open_turn < 0; }
  } episode;

  bool is_group() const { return partial.tokens.empty(); }
  int64_t response_length() const { return is_group() ? 0 : partial.response_length(); }
};

}  // namespace slimpi
