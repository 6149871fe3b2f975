// LrSchedule — the learning rate at optimizer step s (0-based):
//   warm-up:  lr · (s + 1) / warmup_steps                 for s < warmup_steps
//   constant: lr
//   cosine:   min_lr + (lr − min_lr) · ½(1 + cos(π · p)),  p = (s − warmup) / (decay_steps − warmup)
//             clamped to [0, 1] (min_lr after decay_steps)
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/registry.h"

namespace slimpi {

struct LrSchedule {
  std::string style = "constant";  // a name in lr_schedules()
  double lr = 1e-4;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;  // cosine: the step at which min_lr is reached

  double at(int64_t step) const;
};

// After warm-up: the rate at decay progress p = (s − warmup) / (decay_steps − warmup)
// clamped to [0, 1] (p = 0 when decay_steps <= warmup_steps).
using LrDecay = std::function<double(const LrSchedule&, double progress)>;
const Registry<LrDecay>& lr_schedules();

}  // namespace slimpi
