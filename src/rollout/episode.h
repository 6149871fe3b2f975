// EpisodeRunner::Episode — one open episode of an EpisodeRunner (rollout/episode_runner.h):
// its trajectory so far, the turns sent, its phase in the state machine and, resumed from
// a checkpoint, the record it replays or the snapshot it is restored from. Private to the
// runner's three files: the state machine (episode_runner.cpp), resume and replay
// (episode_resume.cpp) and the trajectory's views (episode_trajectory.cpp).
#pragma once

#include <fmt/format.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/timer.h"
#include "rollout/episode_runner.h"
#include "tokenizer/chat_transcript.h"

namespace slimpi {

struct EpisodeRunner::Episode {
  std::string id;
  GenerationRequest request;          // the group's; prompt = the episode's context once reset
  std::vector<int64_t> group_prompt;  // the group's prompt tokens (request.prompt before the reset)
  Prompt prompt;
  Sample sample;  // the trajectory so far; every per-response-token field complete
  WorkItem::EpisodeTurns turns;  // the model turns sent to the environment so far (open_turn unused)
  std::unique_ptr<ChatTranscript> transcript;
  // NotStarted -> Reset (or Restore) -> Turn -> Step -> Turn -> ... -> finished (erased);
  // Step -> Ending -> finished: stopped at a limit, waiting for its reward (Environment::end)
  enum class Phase { NotStarted, Reset, Restore, Turn, Step, Ending } phase = Phase::NotStarted;
  EnvError end_error = EnvError::None;  // Ending: the limit that stopped it, and why
  std::string end_why;
  int64_t turn_start = 0;  // response length where the current model turn began
  int64_t budget = 0;      // response tokens the episode may reach
  double reward_sum = 0, last_reward = 0;
  Stopwatch clock;  // since the reset was sent
  Stopwatch wait;   // since the outstanding request was sent
  // A resumed episode: the checkpointed trajectory and turns it is brought back to; `next`
  // is the recorded turn to send next. Gone once the episode has caught up.
  struct Replay {
    Sample recorded;
    WorkItem::EpisodeTurns turns;
    size_t next = 0;
  };
  std::optional<Replay> replay;
  std::string env_snapshot;  // the environment's state after the last reply (info().snapshots)
  // A resumed episode restored from its snapshot: the checkpointed item, until restored.
  std::optional<WorkItem> restoring;
  // Threads (EnvReply::resume_context), per context as EpisodeAction::context numbers them:
  // the chat transcript where the episode left it for a later context ("" while it is the
  // latest, once it is continued, or when it was left because the template rewrote its
  // history: then it cannot be resumed), and the context it continues (-1: none). An
  // observation that resumes context `resuming` carries its transcript to
  // append_observation in `resumed_transcript`; `rewrote` marks an observation that opens a
  // context because the template would rewrite the history.
  std::vector<std::string> left_transcripts;
  std::vector<int64_t> continued_from;
  int64_t resuming = -1;
  std::unique_ptr<ChatTranscript> resumed_transcript;
  bool rewrote = false;
};

// "<stream>/<group>/<sample>": unique for the run.
inline std::string episode_id(uint64_t stream, int64_t group, int64_t index) {
  return fmt::format("{}/{}/{}", stream, group, index);
}

}  // namespace slimpi
