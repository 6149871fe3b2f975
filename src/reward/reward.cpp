#include "reward/reward.h"

#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <cmath>

#include "reward/command_reward.h"

namespace slimpi {
namespace {

using SingleReward = float (*)(const std::string&, const std::string&);

// A per-sample verifier as a batch style.
RewardStyle each_sample(SingleReward score) {
  return [score](const RewardConfig&, const std::vector<RewardInput>& batch) {
    std::vector<float> out;
    out.reserve(batch.size());
    for (const auto& b : batch) out.push_back(score(b.response, b.label));
    return out;
  };
}

}  // namespace

const Registry<RewardStyle>& reward_styles() {
  static const Registry<RewardStyle> r = [] {
    Registry<RewardStyle> reg("reward.style");
    reg.add("exact_match", each_sample(exact_match_reward));
    reg.add("math", each_sample(math_reward));
    reg.add("countdown", each_sample(countdown_reward));
    reg.add("f1", each_sample(f1_reward));
    reg.add("environment", [](const RewardConfig&, const std::vector<RewardInput>& batch) {
      std::vector<float> r;
      for (const RewardInput& in : batch) r.push_back(in.episode_reward);
      return r;
    });
    reg.add("command", [](const RewardConfig& cfg, const std::vector<RewardInput>& batch) {
      return command_rewards(cfg.command, cfg.command_timeout_s, batch, cfg.command_max_stderr_bytes);
    });
    return reg;
  }();
  return r;
}

RewardConfig RewardConfig::from_deck(const Deck& deck) {
  RewardConfig c;
  c.style = deck.get_string("reward.style");
  c.command = deck.get_string("reward.command");
  c.command_timeout_s = deck.get_float("reward.command_timeout_s");
  c.command_max_stderr_bytes = deck.get_int("reward.command_max_stderr_bytes");
  if (c.style == "command" && c.command.empty())
    SLIMPI_FAIL_ALL("reward.style = \"command\" ({}) needs reward.command", deck.source("reward.style"));
  // The other ranks wait for the scores under the watchdog: a command allowed to run
  // longer would have the job ended blaming a dead peer before its own time-out fires.
  const double watchdog_s = deck.get_float("parallel.timeout_s");
  if (c.style == "command" && c.command_timeout_s >= watchdog_s)
    SLIMPI_FAIL_ALL("reward.command_timeout_s = {} ({}) must be below parallel.timeout_s = {} ({}): the ranks that "
                    "wait for the scores would be stopped by the watchdog first (the wait also holds the batch's "
                    "generation, so leave room for it)",
                    c.command_timeout_s, deck.source("reward.command_timeout_s"), watchdog_s,
                    deck.source("parallel.timeout_s"));
  return c;
}

std::vector<float> compute_rewards(const RewardConfig& cfg, const std::vector<RewardInput>& batch) {
  std::vector<float> rewards = reward_styles().get(cfg.style)(cfg, batch);
  // A NaN or inf reward would train NaN weights (or pass every eval): never accepted.
  for (size_t i = 0; i < rewards.size(); ++i)
    if (!std::isfinite(rewards[i])) {
      SLIMPI_FAIL("reward.style = \"{}\" gave the non-finite reward {} to sample {} of {} (response \"{}\", label "
                  "\"{}\"); rewards must be finite numbers",
                  cfg.style, rewards[i], i, batch.size(), printable_excerpt(batch[i].response),
                  printable_excerpt(batch[i].label));
    }
  return rewards;
}

}  // namespace slimpi
