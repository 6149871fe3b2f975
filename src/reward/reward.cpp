#include "reward/reward.h"

#include <slimpi/error.h>

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
    reg.add("command", [](const RewardConfig& cfg, const std::vector<RewardInput>& batch) {
      return command_rewards(cfg.command, cfg.command_timeout_s, batch);
    });
    return reg;
  }();
  return r;
}

std::vector<float> compute_rewards(const RewardConfig& cfg, const std::vector<RewardInput>& batch) {
  return reward_styles().get(cfg.style)(cfg, batch);
}

}  // namespace slimpi
