#include "tokenizer/hf_tokenizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "tokenizer/byte_tokenizer.h"

namespace slimpi {
namespace {

nlohmann::json read_json_if_present(const std::filesystem::path& file) {
  if (!std::filesystem::exists(file)) return nullptr;
  try {
    return nlohmann::json::parse(std::ifstream(file));
  } catch (const nlohmann::json::exception& e) {
    SLIMPI_FAIL("{}: not valid JSON: {}", file.string(), e.what());
  }
}

}  // namespace

HfTokenizer::HfTokenizer(const std::string& path)
    : bpe_(path), dir_(std::filesystem::path(bpe_.path()).parent_path()) {
  const std::filesystem::path& dir = dir_;
  auto add = [&](int64_t id) {
    if (std::find(eos_.begin(), eos_.end(), id) == eos_.end()) eos_.push_back(id);
  };
  const nlohmann::json gen = read_json_if_present(dir / "generation_config.json");
  if (gen.is_object() && gen.contains("eos_token_id")) {
    const auto& e = gen["eos_token_id"];
    if (e.is_number_integer()) add(e.get<int64_t>());
    else if (e.is_array())
      for (const auto& x : e) add(x.get<int64_t>());
  }
  // tokenizer_config.json names tokens by their text, a string or {"content": ...}.
  const nlohmann::json cfg = read_json_if_present(dir / "tokenizer_config.json");
  auto config_token = [&](const char* key) -> std::optional<std::string> {
    if (!cfg.is_object() || !cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
    const auto& e = cfg[key];
    return e.is_string() ? e.get<std::string>() : e.value("content", std::string());
  };
  auto id_of = [&](const std::optional<std::string>& token) -> std::optional<int64_t> {
    if (!token) return std::nullopt;
    const int64_t id = bpe_.token_id(*token);
    return id >= 0 ? std::optional<int64_t>(id) : std::nullopt;
  };
  if (const auto eos = config_token("eos_token")) {
    const auto id = id_of(eos);
    SLIMPI_CHECK(id, "{}: eos_token '{}' is not in {}", (dir / "tokenizer_config.json").string(), *eos, bpe_.path());
    add(*id);
  }
  if (cfg.is_object() && cfg.contains("chat_template")) {
    const nlohmann::json& t = cfg["chat_template"];
    if (t.is_string()) chat_template_ = {t.get<std::string>(), (dir / "tokenizer_config.json").string()};
    else if (t.is_array())
      for (const auto& named : t)
        if (named.is_object() && named.value("template", nlohmann::json()).is_string() &&
            (chat_template_.text.empty() || named.value("name", std::string()) == "default"))
          chat_template_ = {named["template"].get<std::string>(),
                            (dir / "tokenizer_config.json").string() + " (" + named.value("name", std::string()) + ")"};
  }
  if (chat_template_.text.empty() && std::filesystem::exists(dir / "chat_template.jinja")) {
    std::ifstream in(dir / "chat_template.jinja");
    chat_template_ = {std::string(std::istreambuf_iterator<char>(in), {}), (dir / "chat_template.jinja").string()};
  }
  bos_ = id_of(config_token("bos_token"));
  if (bos_) bos_text_ = *config_token("bos_token");
  pad_ = id_of(config_token("pad_token"));
  SLIMPI_CHECK(!eos_.empty(),
               "{}: no end-of-sequence token: generation_config.json (eos_token_id) or tokenizer_config.json "
               "(eos_token) must name one, or generation would never stop",
               dir.string());
  for (int64_t id : eos_)
    SLIMPI_CHECK(id >= 0 && id < bpe_.vocab_size(), "{}: eos id {} is outside the vocabulary ({} ids)", dir.string(),
                 id, bpe_.vocab_size());
}

std::vector<int64_t> HfTokenizer::encode_response(const std::string& text) const {
  std::vector<int64_t> ids = bpe_.encode(text, false);
  ids.push_back(eos_.front());
  return ids;
}

std::string HfTokenizer::describe() const {
  return fmt::format("{} ({} ids, stop at {})", bpe_.path(), bpe_.vocab_size(), fmt::join(eos_, ", "));
}

std::shared_ptr<const Tokenizer> make_tokenizer(const std::string& path) {
  if (path == "bytes") return std::make_shared<ByteTokenizer>();
  // One load per path and process (the rollout config and the trainer's data ask for
  // the same one). Every rank reads the same files, so a problem is the same on all of
  // them: reported as a collective error (every rank stops cleanly).
  static std::map<std::string, std::weak_ptr<const Tokenizer>> loaded;
  if (auto t = loaded[path].lock()) return t;
  std::shared_ptr<const Tokenizer> t;
  try {
    t = std::make_shared<HfTokenizer>(path);
  } catch (const Error& e) {
    SLIMPI_FAIL_ALL("tokenizer.path = \"{}\": {}", path, e.what());
  }
  loaded[path] = t;
  return t;
}

std::shared_ptr<const Tokenizer> make_tokenizer(const Deck& deck) {
  std::shared_ptr<const Tokenizer> tok = make_tokenizer(deck.get_string("tokenizer.path"));
  // The model needs a row for every id the tokenizer can produce.
  if (deck.get_int("model.vocab_size") < tok->vocab_size())
    SLIMPI_FAIL_ALL("model.vocab_size = {} ({}) is smaller than the tokenizer's {} ids (tokenizer.path = \"{}\", {})",
                    deck.get_int("model.vocab_size"), deck.source("model.vocab_size"), tok->vocab_size(),
                    deck.get_string("tokenizer.path"), deck.source("tokenizer.path"));
  return tok;
}

std::string vocabulary_difference(const Tokenizer& a, const Tokenizer& b) {
  if (a.vocab_size() != b.vocab_size())
    return fmt::format("{} ids against {}", a.vocab_size(), b.vocab_size());
  if (a.stop_ids() != b.stop_ids())
    return fmt::format("stop ids [{}] against [{}]", fmt::join(a.stop_ids(), ", "), fmt::join(b.stop_ids(), ", "));
  for (int64_t id = 0; id < a.vocab_size(); ++id) {
    const std::string x = a.decode({id}), y = b.decode({id});
    if (x != y) return fmt::format("id {} is \"{}\" against \"{}\"", id, x, y);
  }
  return "";
}

}  // namespace slimpi
