// The schema itself: every default satisfies its own rules; names follow conventions.
#include <gtest/gtest.h>

#include <regex>

#include "cli/commands.h"
#include "deck/schema.h"

namespace slimpi {
namespace {

TEST(Schema, EveryDefaultPassesItsOwnChecks) {
  for (const auto& spec : Schema::instance().keys()) {
    DeckValue v = spec.default_value;
    EXPECT_EQ(check_deck_value(spec, v), std::nullopt) << spec.key;
    EXPECT_FALSE(spec.help.empty()) << spec.key;
  }
}

TEST(Schema, KeysAreTableDotSnakeCaseAndUnique) {
  std::set<std::string> seen;
  for (const auto& spec : Schema::instance().keys()) {
    EXPECT_TRUE(std::regex_match(spec.key, std::regex("[a-z]+(\\.[a-z][a-z0-9_]*)+"))) << spec.key;
    EXPECT_TRUE(seen.insert(spec.key).second) << "duplicate " << spec.key;
  }
}

TEST(Schema, NearestKey) {
  const Schema& s = Schema::instance();
  EXPECT_EQ(s.nearest_key("run.nsteps"), "run.n_steps");
  EXPECT_EQ(s.nearest_key("parallel.placment"), "parallel.placement");
  EXPECT_EQ(s.nearest_key("rollout.seed"), "run.seed");
  EXPECT_EQ(s.nearest_key("completely.unrelated_thing"), "");
  EXPECT_TRUE(s.is_table("run"));
  EXPECT_FALSE(s.is_table("ru"));
}

TEST(Schema, KeysListingShowsTypeDefaultRangeUnitAndHelp) {
  std::string text = cli::describe_keys("parallel.timeout");
  EXPECT_EQ(text,
            "[parallel]\n"
            "  parallel.timeout_s           float    default 600.0      range [1, 1e+07] (s)\n"
            "      a blocking collective waiting longer than this aborts the job, naming it\n");
  EXPECT_NE(cli::describe_keys("").find("one of split | colocate"), std::string::npos);
  EXPECT_EQ(cli::describe_keys("nothing"), "");
}

TEST(Schema, FormatsValuesAsToml) {
  EXPECT_EQ(format_deck_value(DeckValue(1.0)), "1.0");
  EXPECT_EQ(format_deck_value(DeckValue(2.5e-7)), "2.5e-07");
  EXPECT_EQ(format_deck_value(DeckValue(std::string("a\"b"))), "\"a\\\"b\"");
  EXPECT_EQ(format_deck_value(DeckValue(std::vector<std::string>{"x", "y"})), "[\"x\", \"y\"]");
  EXPECT_EQ(format_deck_value(DeckValue(int64_t{-3})), "-3");
}

}  // namespace
}  // namespace slimpi
