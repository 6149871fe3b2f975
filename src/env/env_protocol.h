// The environment protocol's JSON lines (version 1, docs/environments.md): the
// messages slimpi writes to an environment process and the parsing of its replies.
// One JSON object per line each way; slimpi writes hello, reset, step, close; the
// process answers hello once, then one reply (type observation or error) per reset and
// step, tagged with the episode, in any order. An environment whose hello says
// "snapshots": true puts the episode's state in every observation ("snapshot") and
// answers a restore (a reset's fields with a snapshot) with type restored. Parsing checks every field an
// environment can get wrong (types, finite numbers, token ids in the vocabulary, known
// roles and error classes) and says what is wrong. Pure functions.
#pragma once

#include <string>

#include "env/environment.h"

namespace slimpi {

constexpr int64_t kEnvProtocolVersion = 1;
// A hello's max_concurrent_episodes is capped here; a reward (or the sum of its parts)
// beyond ±kMaxAbsReward is a bad reply (the sum over an episode's steps stays a float).
constexpr int64_t kMaxConcurrentEpisodes = int64_t(1) << 20;
constexpr double kMaxAbsReward = 1e6;
// A metric beyond ±kMaxAbsMetric is a bad reply (sums over an episode's steps stay finite).
constexpr double kMaxAbsMetric = 1e12;

std::string encode_hello();
std::string encode_reset(const EpisodeStart& start);
std::string encode_step(const EpisodeAction& action);
// The reset's fields, "turns" (model turns the snapshot follows) and "snapshot" (JSON text).
std::string encode_restore(const EpisodeStart& start, int64_t turns, const std::string& snapshot);
std::string encode_close(const std::string& episode);

// The process's hello; "" on success, else what is wrong with it.
std::string decode_hello(const std::string& line, EnvInfo* info);

enum class ReplyParse {
  Ok,
  BadReply,  // the episode is known (reply->episode set) but the reply is unusable: error says why
  Garbage,   // not a reply that names an episode
};
// vocab_size: token ids must be in [0, vocab_size).
ReplyParse decode_reply(const std::string& line, int64_t vocab_size, EnvReply* reply, std::string* error);

}  // namespace slimpi
