// ThreeTurnEnvironment — a deterministic in-process environment for the episode tests
// (test_streaming_router, test_disaggregation). Plain test support: single-threaded, its
// replies arrive kLatency polls after their requests.
#pragma once

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "env/environment.h"

namespace slimpi::testing {

// A deterministic in-process environment for the episode tests: every episode takes
// three model turns; steps 1 and 2 answer a user message "turn K: N bytes" (N: the
// turn's text) with reward 0.25, step 3 ends it with reward 1 when N is even.
// With snapshots (and, in the tests that use them, a new context after turn 1: split
// trajectories, as in test_streaming_router's SplitEpisodes), it keeps each episode's
// state (its turns and the bytes of all its turns so far, which its observations show as
// "(total T)"): a state a reset cannot rebuild, only a restore from the snapshot its
// observations carry.
class ThreeTurnEnvironment : public Environment {
 public:
  // salt: appended to every observation (a "deterministic" environment that answers
  // otherwise after a restart).
  // new_context_at: the reply to that turn opens a new context ("new context K"), not appended.
  explicit ThreeTurnEnvironment(bool deterministic, std::string salt = "", bool snapshots = false,
                                int64_t new_context_at = 0)
      : salt_(std::move(salt)), new_context_at_(new_context_at) {
    info_.protocol_version = 1;
    info_.name = "three_turns";
    info_.max_concurrent_episodes = 1 << 20;
    info_.deterministic = deterministic;
    info_.snapshots = snapshots;
  }
  const EnvInfo& info() const override { return info_; }
  void reset(const EpisodeStart& start) override {
    open_[start.episode] = {0, 0};
    EnvReply r;
    r.episode = start.episode;
    if (info_.snapshots) r.snapshot = R"({"turns":0,"total":0})";
    replies_.push_back({0, r});
  }
  void restore(const EpisodeStart& start, int64_t turns, const std::string& snapshot) override {
    ++restores;
    const nlohmann::json j = nlohmann::json::parse(snapshot);
    EXPECT_EQ(j.at("turns").get<int64_t>(), turns) << start.episode;
    open_[start.episode] = {j.at("turns").get<int64_t>(), j.at("total").get<int64_t>()};
    EnvReply r;
    r.episode = start.episode;
    r.restored = true;
    replies_.push_back({0, r});
  }
  void step(const EpisodeAction& a) override {
    ++steps;
    auto it = open_.find(a.episode);
    if (it == open_.end()) {
      ADD_FAILURE() << "a step for episode " << a.episode << ", neither reset nor restored here";
      return;
    }
    auto& [turns, total] = it->second;
    EXPECT_EQ(a.turn, turns + 1) << a.episode;
    turns = a.turn;
    EnvReply r;
    r.episode = a.episode;
    const size_t n = a.text.size();
    total += int64_t(n);
    if (a.turn >= 3) {
      r.reward = n % 2 == 0 ? 1.0 : 0.0;
      r.done = true;
    } else {
      const std::string shown = info_.snapshots ? " (total " + std::to_string(total) + ")" : "";
      r.messages.push_back({"user", "turn " + std::to_string(a.turn) + ": " + std::to_string(n) + " bytes" + shown + salt_});
      if (a.turn == new_context_at_) {
        r.messages = {{"user", "new context " + std::to_string(a.turn), false, ""}};
        r.new_context = true;
      }
      r.reward = 0.25;
    }
    if (info_.snapshots) r.snapshot = nlohmann::json{{"turns", turns}, {"total", total}}.dump();
    replies_.push_back({0, r});
  }
  void close(const std::string& episode) override { open_.erase(episode); }
  // A reply comes kLatency polls after its request (so that a pause finds episodes waiting).
  static constexpr int kLatency = 8;
  std::vector<EnvReply> poll(double) override {
    std::vector<EnvReply> out;
    for (auto it = replies_.begin(); it != replies_.end();)
      if (++it->first >= kLatency) {
        out.push_back(std::move(it->second));
        it = replies_.erase(it);
      } else {
        ++it;
      }
    return out;
  }
  int64_t capacity() const override { return info_.max_concurrent_episodes; }
  int64_t steps = 0, restores = 0;

 private:
  EnvInfo info_;
  std::string salt_;
  int64_t new_context_at_ = 0;
  std::map<std::string, std::pair<int64_t, int64_t>> open_;  // episode -> (turns, bytes of its turns)
  std::deque<std::pair<int, EnvReply>> replies_;  // (polls so far, reply)
};

}  // namespace slimpi::testing
