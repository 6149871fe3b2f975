#include "train/teacher_scores.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <tuple>

#include "model/head_top_k.h"
#include "model/log_probs.h"
#include "model/transformer.h"
#include "train/micro_batches.h"
#include "train/packed_batch.h"
#include "train/trainer_config.h"

namespace slimpi {

void score_with_teacher(const Transformer& teacher, std::vector<Sample>& samples, const TeacherScoring& how) {
  at::NoGradGuard no_grad;
  const bool top_k = how.top_k > 0;
  std::vector<int64_t> lengths;
  for (const auto& s : samples) lengths.push_back(s.packed_length());
  for (const auto& which : plan_micro_batches(lengths, how.n_micro_batches, how.max_tokens_per_micro_batch)) {
    PackedBatch b = pack(samples, which, teacher.device());
    b.support = at::Tensor();  // the teacher's whole distribution, whatever the student sampled from
    at::Tensor hidden;         // [T, d]
    const at::Tensor logp = packed_log_probs(teacher, b, how.precision, how.temperature, false, nullptr,
                                             top_k ? &hidden : nullptr).logp.cpu().contiguous();  // [N]
    at::Tensor ids, q;  // [N, k] each
    if (top_k) {
      const ScoredPositions at = response_positions(b.tokens, b.seq_lens, b.prompt_lens);
      // Only ids the student has rows for (a teacher may pad its vocabulary further).
      std::tie(ids, q) = head_top_k(teacher, hidden, at.logit_rows, how.top_k, how.temperature, how.vocab_limit);
      ids = ids.cpu().contiguous();
      q = q.cpu().contiguous();
    }
    int64_t start = 0;
    for (int64_t i : which) {
      Sample& s = samples[size_t(i)];
      const int64_t n = s.response_length();
      s.teacher_log_probs.assign(logp.data_ptr<float>() + start, logp.data_ptr<float>() + start + n);
      if (top_k) {
        const int64_t k = ids.size(1);
        s.teacher_topk_ids.assign(ids.data_ptr<int64_t>() + start * k, ids.data_ptr<int64_t>() + (start + n) * k);
        s.teacher_topk_probs.assign(q.data_ptr<float>() + start * k, q.data_ptr<float>() + (start + n) * k);
      }
      start += n;
    }
  }
}

TeacherScoring teacher_scoring(const TrainerConfig& cfg, int64_t student_vocab) {
  TeacherScoring how;
  how.precision = cfg.precision;
  how.temperature = cfg.temperature;
  how.n_micro_batches = cfg.n_micro_batches;
  how.max_tokens_per_micro_batch = cfg.max_tokens_per_micro_batch;
  how.top_k = cfg.opd_topk_loss_coef > 0 ? cfg.opd_top_k : 0;
  how.vocab_limit = student_vocab;
  return how;
}

}  // namespace slimpi
