// Deck loading: includes, overrides, and the exact messages for every kind of bad deck.
#include <gtest/gtest.h>
#include <slimpi/deck.h>
#include <slimpi/error.h>

#include <filesystem>
#include <fstream>

#include "config/deck_broadcast.h"
#include "parallel/world.h"

namespace slimpi {
namespace {

namespace fs = std::filesystem;

// A scratch directory of deck files for one test.
class DeckFiles : public ::testing::Test {
 protected:
  fs::path dir_;
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("slimpi_deck_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
  // The message load_deck throws (and that the error is collective).
  std::string error_of(const std::string& path, const std::vector<std::string>& overrides = {}) {
    try {
      load_deck(path, overrides);
    } catch (const Error& e) {
      EXPECT_TRUE(e.collective());
      return e.what();
    }
    ADD_FAILURE() << "deck " << path << " loaded without error";
    return "";
  }
};

TEST_F(DeckFiles, DefaultsFillUnsetKeys) {
  Deck d = load_deck(write("d.toml", "[run]\nn_steps = 7\n"), {});
  EXPECT_EQ(d.get_int("run.n_steps"), 7);
  EXPECT_EQ(d.get_string("run.name"), "slimpi");
  EXPECT_EQ(d.get_string("parallel.placement"), "split");
  EXPECT_DOUBLE_EQ(d.get_float("parallel.timeout_s"), 600.0);
  EXPECT_TRUE(d.is_default("run.name"));
  EXPECT_EQ(d.source("run.n_steps"), (dir_ / "d.toml").string() + ":2");
}

TEST_F(DeckFiles, IncludesResolveRelativeToTheIncludingFileAndTheIncluderWins) {
  write("base/common.toml", "[run]\nname = \"base\"\nseed = 5\nn_steps = 2\n");
  write("base/mid.toml", "include = [\"common.toml\"]\n[run]\nseed = 6\n");
  std::string top = write("exp/top.toml", "include = [\"../base/mid.toml\"]\n[run]\nn_steps = 9\n");
  Deck d = load_deck(top, {});
  EXPECT_EQ(d.get_string("run.name"), "base");
  EXPECT_EQ(d.get_int("run.seed"), 6);
  EXPECT_EQ(d.get_int("run.n_steps"), 9);
  EXPECT_EQ(d.source("run.name"), (dir_ / "exp/../base/common.toml").string() + ":2");
  EXPECT_EQ(d.source("run.seed"), (dir_ / "exp/../base/mid.toml").string() + ":3");
}

TEST_F(DeckFiles, OverridesApplyLastWithTomlTypes) {
  std::string p = write("d.toml", "[run]\nn_steps = 2\nname = \"a\"\n");
  Deck d = load_deck(p, {"run.n_steps=40", "run.name=bare_word", "parallel.timeout_s=30",
                         "parallel.placement=\"colocate\""});
  EXPECT_EQ(d.get_int("run.n_steps"), 40);
  EXPECT_EQ(d.get_string("run.name"), "bare_word");
  EXPECT_DOUBLE_EQ(d.get_float("parallel.timeout_s"), 30.0);  // integer literal widened
  EXPECT_EQ(d.get_string("parallel.placement"), "colocate");
  EXPECT_EQ(d.source("run.n_steps"), "--set");
}

TEST_F(DeckFiles, UnknownKeyNamesFileLineAndNearestKey) {
  std::string p = write("d.toml", "[run]\nn_steps = 2\nseeed = 3\n");
  EXPECT_EQ(error_of(p), "1 problem in deck " + p + ":\n  " + p +
                             ":3: unknown key 'run.seeed' (did you mean run.seed?); `slimpi keys` lists the valid keys");
}

TEST_F(DeckFiles, KeyInTheWrongTableSuggestsTheRightOne) {
  std::string p = write("d.toml", "[parallel]\nseed = 3\n");
  EXPECT_NE(error_of(p).find("unknown key 'parallel.seed' (did you mean run.seed?)"), std::string::npos);
}

TEST_F(DeckFiles, EveryProblemIsReportedInOnePass) {
  std::string p = write("d.toml",
                        "[run]\n"
                        "n_steps = \"10\"\n"        // wrong type
                        "seed = -4\n"               // out of range
                        "device = \"gpu\"\n"        // not a choice
                        "nmae = \"x\"\n"            // unknown
                        "[parallel]\n"
                        "trainer_ranks = 1.5\n");   // float for an integer key
  std::string expected = "5 problems in deck " + p + ":\n" +
                         "  " + p + ":2: key 'run.n_steps' must be an integer, got string \"10\"\n" +
                         "  " + p + ":3: key 'run.seed' = -4 is out of range [0, 9e+15]\n" +
                         "  " + p + ":4: key 'run.device' = \"gpu\" is not one of: auto, cpu, cuda\n" +
                         "  " + p + ":5: unknown key 'run.nmae' (did you mean run.name?); `slimpi keys` lists the valid keys\n" +
                         "  " + p + ":7: key 'parallel.trainer_ranks' must be an integer, got float 1.5";
  EXPECT_EQ(error_of(p), expected);
}

TEST_F(DeckFiles, RangeMessageCarriesTheUnit) {
  std::string p = write("d.toml", "[parallel]\ntimeout_s = 0.5\n");
  EXPECT_EQ(error_of(p), "1 problem in deck " + p + ":\n  " + p +
                             ":2: key 'parallel.timeout_s' = 0.5 is out of range [1, 1e+07] s");
}

TEST_F(DeckFiles, BadOverrides) {
  std::string p = write("d.toml", "");
  EXPECT_NE(error_of(p, {"run.n_step=3"}).find("--set run.n_step=3: unknown key 'run.n_step' (did you mean run.n_steps?)"),
            std::string::npos);
  EXPECT_NE(error_of(p, {"run.n_steps=abc"}).find("--set run.n_steps=abc: 'abc' is not a TOML value for integer key 'run.n_steps'"),
            std::string::npos);
  EXPECT_NE(error_of(p, {"run.n_steps"}).find("--set run.n_steps: expected key=value"), std::string::npos);
  EXPECT_NE(error_of(p, {"run.name=3"}).find("--set run.name=3: key 'run.name' must be a string, got integer 3"),
            std::string::npos);
}

TEST_F(DeckFiles, MissingFileSyntaxErrorAndIncludeCycle) {
  std::string missing = (dir_ / "nope.toml").string();
  EXPECT_EQ(error_of(missing), "1 problem in deck " + missing + ":\n  cannot open deck file '" + missing + "'");

  std::string p = write("syntax.toml", "[run]\nn_steps = = 3\n");
  EXPECT_NE(error_of(p).find(p + ":2:11: TOML syntax error"), std::string::npos);

  std::string a = write("a.toml", "include = [\"b.toml\"]\n");
  write("b.toml", "include = [\"a.toml\"]\n");
  EXPECT_NE(error_of(a).find("include cycle"), std::string::npos);

  std::string inc = write("inc.toml", "include = [\"gone.toml\"]\n");
  EXPECT_NE(error_of(inc).find(inc + ":1: cannot open deck file '" + (dir_ / "gone.toml").string() + "'"),
            std::string::npos);
}

TEST_F(DeckFiles, ResolvedTomlAndJsonRoundTrip) {
  std::string p = write("d.toml", "[run]\nname = \"quote\\\"d\"\nn_steps = 4\n[parallel]\ntimeout_s = 12.5\n");
  Deck d = load_deck(p, {"parallel.placement=colocate"});
  Deck again = load_deck(write("resolved.toml", d.to_toml()), {});
  Deck from_json = Deck::from_json(d.to_json());
  for (const auto& [key, entry] : d.entries()) {
    EXPECT_EQ(entry.value, again.entries().at(key).value) << key;
    EXPECT_EQ(entry.value, from_json.entries().at(key).value) << key;
    EXPECT_EQ(entry.source, from_json.entries().at(key).source) << key;
  }
  EXPECT_NO_THROW(validate_deck(from_json));
}

TEST_F(DeckFiles, WrongAccessorIsAProgrammingError) {
  Deck d = load_deck(write("d.toml", ""), {});
  EXPECT_THROW(d.get_string("run.n_steps"), Error);
  EXPECT_THROW(d.get_int("run.nope"), Error);
}

// Cross-key checks of the world layout name every key involved.
TEST_F(DeckFiles, LayoutCrossKeyErrors) {
  auto layout_error = [&](const std::string& text, int world) {
    Deck d = load_deck(write("l.toml", text), {});
    try {
      resolve_layout(d, world);
    } catch (const Error& e) {
      EXPECT_TRUE(e.collective());
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string l = (dir_ / "l.toml").string();
  EXPECT_EQ(layout_error("[parallel]\ntrainer_ranks = 2\nrollout_ranks = 1\n", 4),
            "parallel.placement = \"split\" needs parallel.trainer_ranks + parallel.rollout_ranks = world size "
            "(4 ranks), each at least 1; got parallel.trainer_ranks = 2 (" + l + ":2), parallel.rollout_ranks = 1 (" +
                l + ":3)");
  EXPECT_EQ(layout_error("", 1),
            "parallel.placement = \"split\" needs at least 2 ranks (one trainer, one rollout), but the job has 1: "
            "start more ranks or set parallel.placement = \"colocate\"");
  EXPECT_EQ(layout_error("[parallel]\ntrainer_ranks = 4\n", 4).substr(0, 60),
            "parallel.placement = \"split\" needs parallel.trainer_ranks + ");
  EXPECT_NE(layout_error("[parallel]\nplacement = \"colocate\"\ntrainer_ranks = 1\n", 2)
                .find("parallel.trainer_ranks = 1 (" + l + ":3)"),
            std::string::npos);
}

TEST_F(DeckFiles, LayoutDerivesTheMissingCount) {
  auto layout = [&](const std::string& text, int world) { return resolve_layout(load_deck(write("l.toml", text), {}), world); };
  WorldLayout a = layout("", 4);
  EXPECT_EQ(a.n_trainer, 2);
  EXPECT_EQ(a.n_rollout, 2);
  WorldLayout b = layout("[parallel]\nrollout_ranks = 3\n", 4);
  EXPECT_EQ(b.n_trainer, 1);
  WorldLayout c = layout("[parallel]\ntrainer_ranks = 3\n", 5);
  EXPECT_EQ(c.n_rollout, 2);
  EXPECT_TRUE(c.is_trainer(2));
  EXPECT_TRUE(c.is_rollout(3));
  EXPECT_EQ(c.engine_of(4), 1);
  EXPECT_TRUE(c.in_sync(0));
  EXPECT_FALSE(c.in_sync(1));
  EXPECT_TRUE(c.in_sync(4));
  WorldLayout d = layout("[parallel]\nplacement = \"colocate\"\n", 3);
  EXPECT_TRUE(d.is_trainer(1) && d.is_rollout(1));
  EXPECT_FALSE(d.in_sync(0));
}

}  // namespace
}  // namespace slimpi
