#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace slimpi {

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return lr * double(step + 1) / double(warmup_steps);
  if (style != "cosine" || decay_steps <= warmup_steps) return lr;
  double p = std::clamp(double(step - warmup_steps) / double(decay_steps - warmup_steps), 0.0, 1.0);
  return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
}

}  // namespace slimpi
