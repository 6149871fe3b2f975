#include "reward/reward.h"

#include <slimpi/error.h>

#include <fmt/ranges.h>

#include <functional>
#include <map>

#include "reward/command_reward.h"

namespace slimpi {
namespace {

using SingleReward = float (*)(const std::string&, const std::string&);

const std::map<std::string, SingleReward>& single_styles() {
  static const std::map<std::string, SingleReward> r{
      {"exact_match", exact_match_reward},
      {"math", math_reward},
      {"countdown", countdown_reward},
      {"f1", f1_reward},
  };
  return r;
}

}  // namespace

const std::vector<std::string>& reward_styles() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& [k, v] : single_styles()) n.push_back(k);
    n.push_back("command");
    return n;
  }();
  return names;
}

std::vector<float> compute_rewards(const RewardConfig& cfg, const std::vector<RewardInput>& batch) {
  if (cfg.style == "command") return command_rewards(cfg.command, cfg.command_timeout_s, batch);
  auto it = single_styles().find(cfg.style);
  SLIMPI_CHECK(it != single_styles().end(), "unknown reward style '{}'; valid: {}", cfg.style,
               fmt::join(reward_styles(), ", "));
  std::vector<float> out;
  out.reserve(batch.size());
  for (const auto& b : batch) out.push_back(it->second(b.response, b.label));
  return out;
}

}  // namespace slimpi
