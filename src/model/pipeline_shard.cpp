#include "model/pipeline_shard.h"

#include <fmt/ranges.h>
#include <slimpi/error.h>

#include "model/model_config.h"

namespace slimpi {

bool PipelineShard::holds(const std::string& name, int64_t n_layers, bool embedding_copy) const {
  if (size == 1) return true;
  static const std::string layer_prefix = "model.layers.", mtp_prefix = "model.mtp_layers.";
  if (name.rfind(layer_prefix, 0) == 0) return holds_layer(std::stoll(name.substr(layer_prefix.size())), n_layers);
  if (name == "model.embed_tokens.weight") return first() || (embedding_copy && last());
  if (name == "model.norm.weight" || name == "lm_head.weight" || name.rfind(mtp_prefix, 0) == 0) return last();
  SLIMPI_FAIL("pipeline parallelism: no stage holds parameter {}", name);
}

PipelineShard PipelineShard::for_layers(const std::vector<int64_t>& layers_per_stage) const {
  SLIMPI_CHECK(int(layers_per_stage.size()) == size, "{} stage sizes for a pipeline of {} stages",
               layers_per_stage.size(), size);
  PipelineShard s = *this;
  s.first_layer = 0;
  for (int i = 0; i < stage; ++i) s.first_layer += layers_per_stage[size_t(i)];
  s.end_layer = s.first_layer + layers_per_stage[size_t(stage)];
  return s;
}

bool last_stage_copies_embedding(const ModelConfig& cfg) {
  return cfg.tie_word_embeddings || cfg.mtp_num_layers > 0;
}

std::vector<int64_t> stage_layer_counts(int64_t n_layers, int stages, const std::vector<int64_t>& explicit_layers) {
  SLIMPI_CHECK(stages >= 1 && n_layers >= stages, "pipeline parallelism of {} stages for a model of {} layers: every "
               "stage needs a layer at least", stages, n_layers);
  if (explicit_layers.empty()) {
    std::vector<int64_t> counts(size_t(stages), n_layers / stages);
    for (int64_t s = 0; s < n_layers % stages; ++s) ++counts[size_t(s)];
    return counts;
  }
  int64_t total = 0;
  for (int64_t n : explicit_layers) {
    SLIMPI_CHECK(n >= 1, "pipeline layers [{}]: every stage needs a layer at least", fmt::join(explicit_layers, ", "));
    total += n;
  }
  SLIMPI_CHECK(int64_t(explicit_layers.size()) == stages && total == n_layers,
               "pipeline layers [{}]: {} stage{} of {} layers in all, for {} stages of the model's {} layers",
               fmt::join(explicit_layers, ", "), explicit_layers.size(), explicit_layers.size() == 1 ? "" : "s", total,
               stages, n_layers);
  return explicit_layers;
}

}  // namespace slimpi
