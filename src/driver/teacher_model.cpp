#include "driver/teacher_model.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <vector>

#include "config/hf_config.h"
#include "deck/schema.h"
#include "core/log.h"
#include "io/h5.h"
#include "io/tensor_io.h"
#include "tokenizer/tokenizer.h"

namespace slimpi {
namespace {

namespace fs = std::filesystem;

// A Hugging Face directory's shape and tokenizer path, through the deck loader's own
// reading of config.json (every key at its default, model.init_from = dir).
Deck hf_teacher_deck(const std::string& dir, const std::string& source) {
  std::map<std::string, DeckEntry> entries;
  for (const auto& spec : Schema::instance().keys()) entries[spec.key] = {spec.default_value, "default"};
  entries["model.init_from"] = {std::string(dir), source};
  std::vector<std::string> problems;
  apply_hf_config(entries, problems);
  if (!problems.empty()) {
    // The loader names the key it reads the directory from; here that is teacher.path.
    auto as_teacher = [](std::string text) {
      for (size_t at; (at = text.find("model.init_from")) != std::string::npos;)
        text.replace(at, std::string("model.init_from").size(), "teacher.path");
      return text;
    };
    std::string text = fmt::format("teacher.path = \"{}\" ({}):", dir, source);
    for (const auto& p : problems) text += "\n  " + as_teacher(p);
    SLIMPI_FAIL_ALL("{}", text);
  }
  return Deck(std::move(entries));
}

// A slimpi checkpoint's trunk layers and how many are sparse, from its tensor names
// (every layer has an input norm, a sparse one a router).
struct StoredLayers {
  int64_t n = 0, moe = 0;
};
StoredLayers stored_layers(const std::string& h5_path) {
  h5::File f = h5::File::open(h5_path, false, MPI_COMM_NULL);
  h5::Handle model = h5::open_group(f.id(), "model");
  StoredLayers s;
  while (h5::exists(model.id(), fmt::format("model.layers.{}.input_layernorm.weight", s.n))) {
    s.moe += h5::exists(model.id(), fmt::format("model.layers.{}.mlp.gate.weight", s.n)) ? 1 : 0;
    ++s.n;
  }
  return s;
}

}  // namespace

TeacherSource resolve_teacher(const Deck& deck, const ModelConfig& student, const Tokenizer& tokenizer) {
  const std::string& path = deck.get_string("teacher.path");
  const std::string& source = deck.source("teacher.path");
  if (!fs::exists(path))
    SLIMPI_FAIL_ALL("teacher.path = \"{}\" ({}) does not exist: on-policy distillation (train.opd_kl_coef = {}, {}) "
                    "needs the teacher's weights", path, source, deck.get_float("train.opd_kl_coef"),
                    deck.source("train.opd_kl_coef"));
  ModelConfig cfg = student;
  cfg.mtp_num_layers = 0;  // a teacher scores; it never drafts
  std::string weights = path, shape = "the student's shape";
  if (fs::is_directory(path) && fs::exists(fs::path(path) / "config.json")) {
    const Deck teacher_deck = hf_teacher_deck(path, source);
    cfg = ModelConfig::from_deck(teacher_deck);
    cfg.mtp_num_layers = 0;  // (its files' MTP layers are skipped: io/tensor_io.cpp)
    const auto teacher_vocab = make_tokenizer(teacher_deck.get_string("tokenizer.path"));
    const std::string difference = vocabulary_difference(tokenizer, *teacher_vocab);
    if (!difference.empty())
      SLIMPI_FAIL_ALL("teacher.path = \"{}\" ({}): its tokenizer ({}) is not the student's ({}): {}; the teacher's "
                      "log-probs of the student's tokens would score other text",
                      path, source, teacher_vocab->describe(), tokenizer.describe(), difference);
    shape = fmt::format("{} layers, d {}, from its config.json", cfg.n_layers, cfg.hidden_size);
  } else if (fs::is_directory(path)) {
    weights = (fs::path(path) / "trainer_state.h5").string();
    if (!fs::exists(weights))
      SLIMPI_FAIL_ALL("teacher.path = \"{}\" ({}) is a directory with neither config.json (a Hugging Face model) nor "
                      "trainer_state.h5 (a slimpi checkpoint)", path, source);
  }
  if (shape == "the student's shape") {  // a slimpi checkpoint: its layers must be the student's
    StoredLayers stored;
    try {
      stored = stored_layers(weights);
    } catch (const std::exception& e) {
      SLIMPI_FAIL_ALL("teacher.path = \"{}\" ({}) cannot be read as a slimpi checkpoint: {}", path, source, e.what());
    }
    if (stored.n != cfg.n_layers || stored.moe != cfg.n_moe_layers())
      SLIMPI_FAIL_ALL("teacher.path = \"{}\" ({}) is a slimpi checkpoint of {} layer(s), {} of them MoE; a checkpoint "
                      "teacher takes the student's shape, {} layer(s), {} MoE (model.n_layers, {}): give a checkpoint of "
                      "that shape, or the teacher's Hugging Face export (slimpi export), whose config.json gives its own",
                      path, source, stored.n, stored.moe, cfg.n_layers, cfg.n_moe_layers(), deck.source("model.n_layers"));
  }
  if (cfg.vocab_size < tokenizer.vocab_size())
    SLIMPI_FAIL_ALL("teacher.path = \"{}\" ({}): the teacher has {} vocabulary rows, fewer than the {} ids of the "
                    "student's tokenizer", path, source, cfg.vocab_size, tokenizer.vocab_size());
  const int64_t k = deck.get_int("teacher.top_k"), shared = std::min(cfg.vocab_size, student.vocab_size);
  if (deck.get_float("train.opd_topk_loss_coef") > 0 && k > shared)
    SLIMPI_FAIL_ALL("teacher.top_k = {} ({}) exceeds the {} ids both the teacher and the student have rows for",
                    k, deck.source("teacher.top_k"), shared);
  return {cfg, weights, shape};
}

std::unique_ptr<Transformer> load_teacher(const TeacherSource& source, const at::Device& device,
                                          const PipelineShard& policy_stage) {
  // The teacher's own layers in the policy's stages.
  const PipelineShard stage = policy_stage.for_layers(stage_layer_counts(source.config.n_layers, policy_stage.size, {}));
  auto teacher = std::make_unique<Transformer>(source.config, 0, device, at::kFloat, ExpertShard{}, TensorShard{},
                                               ContextShard{}, stage);
  try {
    load_model_weights(teacher->parameters(), source.weights, "model", false, StoredWhole{&source.config, {}}, stage);
  } catch (const Error& e) {  // on the trainer ranks alone: one rank's error, naming the key
    SLIMPI_FAIL("teacher.path: the teacher's weights {} do not fit {}: {}", source.weights, source.shape, e.what());
  }
  for (auto& p : teacher->parameters()) p.tensor.set_requires_grad(false);
  log::info("teacher: {} ({}; {} parameters), frozen, on every trainer rank{}", source.weights, source.shape,
            source.config.n_params(),
            stage.size > 1 ? fmt::format(" in {} pipeline stages (this rank's: layers {}..{})", stage.size,
                                         stage.first_layer, stage.end_layer - 1)
                           : "");
  return teacher;
}

}  // namespace slimpi
