// Deck keys of the run, its evaluation, checkpoints, debug modes, distillation's teacher
// and the step schedule (train.async): declared beside the code that reads them,
// collected by deck_keys() (cli/deck_keys.cpp).
#include "deck/key_tables.h"

#include "driver/step_schedule.h"

namespace slimpi {

std::vector<KeySpec> driver_keys() {
  return {
      // [run]
      string_key("run.name", "slimpi", "name of the run; also the default run directory"),
      string_key("run.dir", "", "run directory for every output file (\"\" = runs/<run.name>)"),
      int_key("run.seed", 1234, 0, kMaxInt, "", "seed of every random stream of the run"),
      int_key("run.n_steps", 1, 0, 1e9, "steps", "number of RL steps (one rollout + training each)"),
      choice_key("run.device", "auto", {"auto", "cpu", "cuda"},
                 "where tensors live; auto takes the rank's GPU when every rank has one"),
      int_key("run.job_steps", 0, 0, 1e9, "steps",
              "steps this job runs at most before it checkpoints and exits 0 (0 = to run.n_steps); for job chains"),
      int_key("run.threads", 0, 0, 1024, "threads",
              "torch/OpenMP threads per rank (0 = cores on the node / ranks on the node)"),
      // [eval]
      string_key("eval.path", "", "held-out prompts (JSONL with data.input_key and data.label_key; \"\" = no eval)"),
      int_key("eval.interval", 0, 0, 1e9, "steps", "evaluate every this many steps (0 = before the first and at the end)"),
      int_key("eval.n_samples", 1, 1, 1e6, "samples", "samples per prompt for pass@k at rollout.temperature (1 = greedy only)"),
      float_key("eval.stop_at_pass1", 0.0, 0.0, 1.0, "", "end the run once greedy eval pass@1 reaches this (0 = never)"),
      // [checkpoint]
      string_key("checkpoint.dir", "", "checkpoint root (\"\" = <run dir>/ckpt); step_XXXXXXXX/ directories inside"),
      int_key("checkpoint.interval", 0, 0, 1e9, "steps",
              "checkpoint every this many steps (0 = only at the end, at run.job_steps and on SIGTERM/SIGUSR1)"),
      int_key("checkpoint.keep_last", 2, 0, 1e9, "", "complete checkpoints kept (0 = all)"),
      int_key("checkpoint.keep_every", 0, 0, 1e9, "steps", "also keep checkpoints whose step is a multiple of this"),
      string_key("checkpoint.resume", "auto",
                 "auto: newest verified checkpoint (none = fresh start); never: fresh start; or a checkpoint directory"),
      // [teacher]
      string_key("teacher.path", "",
                 "on-policy distillation's teacher: a Hugging Face directory (its own shape; its tokenizer must "
                 "equal the student's) or a slimpi trainer_state.h5 / checkpoint directory (the student's shape)"),
      choice_key("teacher.placement", "trainer", {"trainer", "rollout"},
                 "where the teacher scores the samples: trainer = every trainer rank holds it; rollout = the router "
                 "(rollout rank 0, split placement) scores each batch as it is generated, off the trainers' time"),
      int_key("teacher.top_k", 16, 1, 4096, "tokens",
              "train.opd_topk_loss_coef > 0: the teacher's most likely tokens per position the loss compares"),
      // [debug]
      bool_key("debug.rollout_only", false, "generate and score rollouts but never train (slime's debug_rollout_only)"),
      bool_key("debug.train_only", false,
               "train on the samples recorded in debug.load_rollouts instead of generating (slime's debug_train_only)"),
      string_key("debug.load_rollouts", "", "debug.train_only: a rollouts.h5 whose step s samples train step s"),
      // [train]
      choice_key("train.async", "off", step_schedules().names(),
                 "split placement: one_step_off generates step k+1's batch with step k's weights while the "
                 "trainers train on step k's (staleness 1); full = the rollout ranks generate continuously, "
                 "weights reach them between engine iterations, trainers take a batch when one is queued; "
                 "off = generate, then train")
  };
}

}  // namespace slimpi
