// load_teacher — the teacher of on-policy distillation (train.opd_kl_coef > 0, [teacher]; docs/rl_loop.md):
// a frozen model that scores the student's own samples with one prefill-only forward
// (Trainer::prepare_rollout: teacher_log_probs, the reverse KL d = logp_student −
// logp_teacher, advantages A − opd_kl_coef·d before whitening, as slime's
// apply_opd_kl_to_advantages).
//
// teacher.path is a Hugging Face directory (config.json gives its shape, which may differ
// from the student's; its tokenizer must equal the student's: every id must decode to the
// same text and the stop ids must agree, else the run is refused), or a slimpi
// trainer_state.h5 / checkpoint directory (the student's shape, its vocabulary).
// Built once on every trainer rank (teacher.placement = "trainer"), whole (no tensor or
// expert sharding) or, under pipeline parallelism, in the policy's stages (its own layers
// split as evenly as they go), fp32 weights, never trained.
#pragma once

#include <c10/core/Device.h>

#include <memory>
#include <string>

#include "model/model_config.h"
#include "model/transformer.h"

namespace slimpi {

class Deck;
class Tokenizer;

// Where the teacher's weights are and its shape, every file check done (the deck check
// runs it on every rank: a refusal is collective, naming teacher.path).
struct TeacherSource {
  ModelConfig config;
  std::string weights;  // a Hugging Face directory or an HDF5 file (group "model")
  std::string shape;    // for the log: whose shape it has
};
TeacherSource resolve_teacher(const Deck& deck, const ModelConfig& student, const Tokenizer& tokenizer);

// The frozen teacher: its weights read, no gradient. policy_stage: the policy's pipeline
// stage (size 1: the whole teacher here).
std::unique_ptr<Transformer> load_teacher(const TeacherSource& source, const at::Device& device,
                                          const PipelineShard& policy_stage = {});

}  // namespace slimpi
