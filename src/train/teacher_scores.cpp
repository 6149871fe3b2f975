#include "train/teacher_scores.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <tuple>

#include "model/head_top_k.h"
#include "model/log_probs.h"
#include "model/transformer.h"
#include "train/micro_batches.h"
#include "train/packed_batch.h"
#include "train/pipeline_links.h"
#include "train/pipeline_schedule.h"
#include "train/trainer_config.h"

namespace slimpi {

namespace {

// One micro-batch's teacher scores: [N] log-probs, and with top_k [N, k] ids and probabilities.
struct Scores {
  at::Tensor logp, ids, q;
};

// The teacher's scores of a micro-batch from its final norm's output `hidden` [T, d].
Scores head_scores(const Transformer& teacher, const PackedBatch& b, const at::Tensor& hidden,
                   const TeacherScoring& how) {
  Scores s;
  s.logp = head_token_log_probs(teacher, b, hidden, how.precision, how.temperature, false).logp;
  if (how.top_k > 0) {
    const ScoredPositions at = response_positions(b.tokens, b.seq_lens, b.prompt_lens);
    // Only ids the student has rows for (a teacher may pad its vocabulary further).
    std::tie(s.ids, s.q) = head_top_k(teacher, hidden, at.logit_rows, how.top_k, how.temperature, how.vocab_limit);
  }
  return s;
}

// Pipeline parallelism: every micro-batch through the teacher's stages; every stage gets
// the last stage's scores.
std::vector<Scores> pipelined_scores(const Transformer& teacher, const std::vector<Sample>& samples,
                                     const std::vector<std::vector<int64_t>>& plan, const TeacherScoring& how) {
  const PipelineShard& stage = teacher.pipeline_shard();
  PipelineLinks links(stage);
  std::vector<at::Tensor> logp, ids, q;  // the last stage's, per micro-batch
  std::vector<int64_t> sizes;
  for (const auto& which : plan) {
    PackedBatch b = pack(samples, which, teacher.device());
    b.support = at::Tensor();
    const at::Tensor y = stage_forward(teacher, links, b, how.precision, /*track_input=*/false);
    int64_t n = 0;
    for (int64_t i : which) n += samples[size_t(i)].response_length();
    sizes.push_back(n);
    if (!stage.last()) {
      links.send_forward(y);
      continue;
    }
    Scores s = head_scores(teacher, b, y, how);
    logp.push_back(s.logp);
    ids.push_back(s.ids);
    q.push_back(s.q);
  }
  links.finish();
  std::vector<Scores> out(plan.size());
  const std::vector<at::Tensor> all_logp = from_last_stage(stage, logp, sizes);
  for (size_t m = 0; m < plan.size(); ++m) out[m].logp = all_logp[m];
  if (how.top_k > 0) {
    const std::vector<at::Tensor> all_ids = from_last_stage(stage, ids, sizes, at::kLong, {how.top_k});
    const std::vector<at::Tensor> all_q = from_last_stage(stage, q, sizes, at::kFloat, {how.top_k});
    for (size_t m = 0; m < plan.size(); ++m) {
      out[m].ids = all_ids[m];
      out[m].q = all_q[m];
    }
  }
  return out;
}

}  // namespace

void score_with_teacher(const Transformer& teacher, std::vector<Sample>& samples, const TeacherScoring& how) {
  at::NoGradGuard no_grad;
  const bool top_k = how.top_k > 0;
  std::vector<int64_t> lengths;
  for (const auto& s : samples) lengths.push_back(s.packed_length());
  const auto plan = plan_micro_batches(lengths, how.n_micro_batches, how.max_tokens_per_micro_batch);
  const bool staged = teacher.pipeline_shard().size > 1;
  const std::vector<Scores> from_stages = staged ? pipelined_scores(teacher, samples, plan, how) : std::vector<Scores>{};
  for (size_t m = 0; m < plan.size(); ++m) {
    const std::vector<int64_t>& which = plan[m];
    Scores scores;
    if (staged) {
      scores = from_stages[m];
    } else {
      PackedBatch b = pack(samples, which, teacher.device());
      b.support = at::Tensor();  // the teacher's whole distribution, whatever the student sampled from
      at::Tensor hidden;         // [T, d]
      {
        ForwardPrecision scope(how.precision, teacher.device());
        hidden = teacher.forward_packed_hidden(b.tokens, b.seq_lens);
      }
      scores = head_scores(teacher, b, hidden, how);
    }
    const at::Tensor logp = scores.logp.cpu().contiguous();  // [N]
    at::Tensor ids, q;                                       // [N, k] each
    if (top_k) {
      ids = scores.ids.cpu().contiguous();
      q = scores.q.cpu().contiguous();
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
