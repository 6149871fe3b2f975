#include "driver/step_schedule.h"

namespace slimpi {

const Registry<StepScheduleFactory>& step_schedules() {
  static const Registry<StepScheduleFactory> r("train.async", {{"off", make_sync_schedule},
                                                               {"one_step_off", make_one_step_off_schedule},
                                                               {"full", make_full_async_schedule}});
  return r;
}

}  // namespace slimpi
