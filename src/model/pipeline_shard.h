// PipelineShard — a model's place in a pipeline of p stages (parallel.pipeline_parallel):
// which of the model's layers this rank holds, and the group of the stages.
//
// Stage s holds trunk layers [first_layer, end_layer) (parallel.pipeline_layers, or the
// layers split as evenly as they go, the earlier stages taking one more); the first stage
// also the embedding, the last the final norm, the LM head and the MTP layers. With tied
// embeddings (the head) or MTP layers (their token input) and p > 1 the last stage holds
// a copy of the embedding (the same name): the two copies' gradients are summed over
// `tied` before each update (the MTP layers read the embedding detached: their copy's
// part is 0), both take the same step, and the copy then takes the first stage's values
// (their buffers' reductions may add in another order); only the first stage's counts in
// the gradient norm and is written to checkpoints. Parameters keep the whole model's
// names; a stage's values are the whole model's (every tensor is drawn, the stage keeps
// its own).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slimpi {

class Comm;
struct ModelConfig;

struct PipelineShard {
  int stage = 0, size = 1;     // this rank's stage and the number of stages (1: every layer)
  Comm* comm = nullptr;        // the ranks of the same place in every stage (required when size > 1)
  Comm* tied = nullptr;        // the first and last stage's ranks of that place (the embedding's copies, size > 1)
  int64_t first_layer = 0, end_layer = -1;  // trunk layers held; end_layer -1: to the last

  bool first() const { return stage == 0; }
  bool last() const { return stage == size - 1; }
  bool holds_layer(int64_t layer, int64_t n_layers) const {
    return layer >= first_layer && layer < (end_layer < 0 ? n_layers : end_layer);
  }
  // Whether parameter `name` of a model with `n_layers` trunk layers is held here (the
  // last stage's copy of the embedding included when `embedding_copy`:
  // last_stage_copies_embedding).
  bool holds(const std::string& name, int64_t n_layers, bool embedding_copy) const;
  // The same place in the pipeline for a model whose stages hold `layers_per_stage`
  // layers each (another model run in the same stages: a teacher).
  PipelineShard for_layers(const std::vector<int64_t>& layers_per_stage) const;
  // Whether `name` here is the last stage's copy of the embedding (p > 1).
  bool is_embedding_copy(const std::string& name, bool embedding_copy) const {
    return size > 1 && embedding_copy && last() && !first() && name == "model.embed_tokens.weight";
  }
};

// Whether a pipeline's last stage holds a copy of the embedding: its head (tied
// embeddings) or its MTP layers' token input.
bool last_stage_copies_embedding(const ModelConfig& cfg);

// The layers of each of `stages` stages: `explicit_layers` when given (one count a stage,
// each at least 1, summing to n_layers: checked), else n_layers split as evenly as they
// go, the earlier stages taking one more. Throws slimpi::Error naming the numbers.
std::vector<int64_t> stage_layer_counts(int64_t n_layers, int stages, const std::vector<int64_t>& explicit_layers);

}  // namespace slimpi
