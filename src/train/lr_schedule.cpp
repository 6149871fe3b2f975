#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace slimpi {

const Registry<LrDecay>& lr_schedules() {
  static const Registry<LrDecay> r = [] {
    Registry<LrDecay> reg("train.lr_schedule");
    reg.add("constant", [](const LrSchedule& s, double) { return s.lr; });
    reg.add("cosine", [](const LrSchedule& s, double p) {
      return s.min_lr + (s.lr - s.min_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
    });
    return reg;
  }();
  return r;
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return lr * double(step + 1) / double(warmup_steps);
  if (decay_steps <= warmup_steps) return lr;
  const double p = std::clamp(double(step - warmup_steps) / double(decay_steps - warmup_steps), 0.0, 1.0);
  return lr_schedules().get(style)(*this, p);
}

}  // namespace slimpi
