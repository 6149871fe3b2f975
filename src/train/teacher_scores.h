// score_with_teacher — a frozen teacher's view of the student's samples (on-policy
// distillation, docs/rl_loop.md): one prefill-only forward per micro-batch, no grad, on
// whichever rank holds the teacher (a trainer rank, teacher.placement = "trainer", or the
// router, "rollout").
#pragma once

#include <slimpi/sample.h>

#include <cstdint>
#include <vector>

#include "model/precision.h"

namespace slimpi {

class Transformer;

struct TeacherScoring {
  Precision precision = Precision::FP32;  // of the forward
  double temperature = 1.0;               // logits / T, as the student's log-probs
  int64_t n_micro_batches = 1, max_tokens_per_micro_batch = 0;  // the trainer's plan (train/micro_batches.h)
  int64_t top_k = 0;       // > 0: also the top-k ids and probabilities (the top-k distillation loss)
  int64_t vocab_limit = 0;  // with top_k: only ids below it (the student's vocabulary)
};

// Fills each sample's teacher_log_probs (whole vocabulary, whatever the sampling support
// the student drew from) and, with top_k, teacher_topk_ids / teacher_topk_probs.
void score_with_teacher(const Transformer& teacher, std::vector<Sample>& samples, const TeacherScoring& how);

struct TrainerConfig;
// The trainer's way (its precision, temperature and micro-batch plan; the top-k when its
// top-k loss is on), for a student of `student_vocab` rows.
TeacherScoring teacher_scoring(const TrainerConfig& cfg, int64_t student_vocab);

}  // namespace slimpi
