// Hugging Face byte-level BPE tokenizers: slimpi's encoder and decoder against the
// `tokenizers` library on 284 strings each (code, CJK, emoji, numbers, accents needing
// NFC, whitespace runs, special tokens inside text), for three tokenizer.json shapes
// (tests/fixtures/tokenizers/make_fixtures.py): ids identical, with and without the
// post-processor's specials; decoding identical, with and without special tokens.
// And what it cannot honour is refused at load.
#include <gtest/gtest.h>
#include <slimpi/error.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizer/bpe_tokenizer.h"

namespace slimpi {
namespace {

namespace fs = std::filesystem;
const fs::path kFixtures = fs::path(SLIMPI_SOURCE_DIR) / "tests/fixtures/tokenizers";

class TokenizerFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerFixture, EncodesAndDecodesAsTokenizersDoes) {
  const fs::path dir = kFixtures / GetParam();
  BpeTokenizer tok(dir.string());
  const nlohmann::json cases = nlohmann::json::parse(std::ifstream(dir / "cases.json"))["cases"];
  ASSERT_GT(cases.size(), 250u);
  int failures = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const auto ids = c["ids"].get<std::vector<int64_t>>();
    const auto with = c["ids_with_specials"].get<std::vector<int64_t>>();
    const bool ok = tok.encode(text) == ids && tok.encode(text, true) == with &&
                    tok.decode(ids) == c["decoded"].get<std::string>() &&
                    tok.decode(ids, true) == c["decoded_skip_special"].get<std::string>();
    if (!ok && ++failures <= 5) {
      ADD_FAILURE() << "text " << nlohmann::json(text).dump() << "\n want " << nlohmann::json(ids).dump()
                    << "\n  got " << nlohmann::json(tok.encode(text)).dump() << "\n decoded "
                    << nlohmann::json(tok.decode(ids)).dump();
    }
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerFixture, ::testing::Values("qwen2_style", "llama3_style", "gpt2_style"));

// Ids past the tokenizer's vocabulary (a model's padded logit rows) decode to nothing, as
// in tokenizers; a NUL inside the text survives the NFC normalizer; long pieces encode
// and decode back.
TEST(BpeTokenizer, EdgeCases) {
  BpeTokenizer tok((kFixtures / "qwen2_style").string());
  const std::vector<int64_t> hello = tok.encode("hello world");
  std::vector<int64_t> padded = hello;
  padded.insert(padded.begin() + 1, {tok.vocab_size(), tok.vocab_size() + 1000, -1});
  EXPECT_EQ(tok.decode(padded), "hello world");
  const std::string with_nul("a\0b c\u00e9", 7);
  EXPECT_EQ(tok.decode(tok.encode(with_nul)), with_nul);
  const std::string long_text(20000, ' ');
  EXPECT_EQ(tok.decode(tok.encode(long_text + "x")), long_text + "x");
  std::string letters;  // one 100 kB piece (a base64 blob, minified code): merged in O(n log n)
  for (int i = 0; i < 100000; ++i) letters += char('a' + (i * 7 + i / 13) % 26);
  EXPECT_EQ(tok.decode(tok.encode(letters)), letters);
}

TEST(BpeTokenizer, RefusesWhatItCannotHonour) {
  const fs::path tmp = fs::temp_directory_path() / ("slimpi_tok_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  const nlohmann::json base = nlohmann::json::parse(std::ifstream(kFixtures / "qwen2_style/tokenizer.json"));
  auto error_of = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = base;
    edit(j);
    std::ofstream(tmp / "tokenizer.json") << j.dump();
    try {
      BpeTokenizer t(tmp.string());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error_of([](auto&) {}), "");
  EXPECT_NE(error_of([](auto& j) { j["model"]["type"] = "Unigram"; }).find("model type 'Unigram'"), std::string::npos);
  EXPECT_NE(error_of([](auto& j) { j["normalizer"] = {{"type", "NFKC"}}; }).find("normalizer 'NFKC'"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& j) { j["model"]["byte_fallback"] = true; }).find("byte_fallback"), std::string::npos);
  EXPECT_NE(error_of([](auto& j) { j["added_tokens"][0]["lstrip"] = true; }).find("lstrip = true"), std::string::npos);
  EXPECT_NE(error_of([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; })
                .find("behavior 'Removed'"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }).find("pre-tokenizer 'Whitespace'"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; })
                .find("does not compile"),
            std::string::npos);
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace slimpi
