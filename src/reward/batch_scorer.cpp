#include "reward/batch_scorer.h"

#include "data/prompt_source.h"
#include "tokenizer/tokenizer.h"

namespace slimpi {

void BatchScorer::add(const Prompt& prompt, const Sample& s) {
  inputs_.push_back({prompt.text, tokenizer_.decode(s.response()), prompt.label, s.raw_reward});
}

std::vector<float> BatchScorer::score() {
  std::vector<float> r = compute_rewards(reward_, inputs_);
  inputs_.clear();
  return r;
}

}  // namespace slimpi
