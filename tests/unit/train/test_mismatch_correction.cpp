// Off-policy correction (train/mismatch_correction.h): slime's vanilla TIS and icepop
// weights and metrics on hand-computed numbers; MIS equal to slime's own
// compute_mis_weights (examples/train_infer_mismatch_helper/mis.py) on 10 settings of
// level / mode / rejection sampling / veto / batch normalisation
// (tests/fixtures/mis/make_fixtures.py): weights, rejection masks and every metric per
// token within 1e-5.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "train/mismatch_correction.h"

namespace slimpi {
namespace {

at::Tensor vec(const std::vector<float>& v) { return at::tensor(v, at::kFloat); }

void expect_close(const at::Tensor& got, const std::vector<float>& want, const std::string& what, double tol = 1e-5) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  const at::Tensor g = got.to(at::kFloat).contiguous();
  for (size_t i = 0; i < want.size(); ++i) {
    const double x = g.data_ptr<float>()[i], y = want[i];
    EXPECT_LE(std::abs(x - y), tol * std::max(1.0, std::abs(y))) << what << " token " << i << ": " << x << " vs " << y;
  }
}

std::map<std::string, at::Tensor> as_map(const MismatchCorrection& c) {
  std::map<std::string, at::Tensor> m;
  for (const auto& [k, v] : c.metrics) m[k] = v;
  return m;
}

TEST(MismatchCorrection, VanillaClampsAndIcepopZeroesOutsideTheBounds) {
  // raw ratios 1, e, 1/e, e^-2 on one sample
  const at::Tensor old = vec({0, 0, 0, 0}), rollout = vec({0, -1, 1, 2}), mask = vec({1, 1, 1, 1});
  const at::Tensor seg = at::zeros({4}, at::kLong);
  MismatchConfig cfg;
  cfg.tis_clip = 2.0;
  cfg.tis_clip_low = 0.3;
  MismatchCorrection v = mismatch_correction(old, rollout, mask, seg, 1, cfg);
  const float e = std::exp(1.0f);
  expect_close(v.weight, {1, 2, 1 / e, 0.3f}, "vanilla weight");
  EXPECT_FALSE(v.keep.defined());
  auto m = as_map(v);
  expect_close(m["tis"], {1, e, 1 / e, 1 / (e * e)}, "tis (the raw ratio, as slime logs it)");
  expect_close(m["tis_clipfrac"], {0, 1, 0, 1}, "tis_clipfrac");
  expect_close(m["tis_abs"], {0, e - 1, 1 - 1 / e, 1 - 1 / (e * e)}, "tis_abs");
  cfg.function = TisFunction::Icepop;
  MismatchCorrection ice = mismatch_correction(old, rollout, mask, seg, 1, cfg);
  expect_close(ice.weight, {1, 0, 1 / e, 0}, "icepop weight");
  expect_close(as_map(ice)["tis_clipfrac"], {0, 1, 0, 1}, "icepop clipfrac");
  EXPECT_EQ(mismatch_metric_names(cfg), (std::vector<std::string>{"tis", "tis_clipfrac", "tis_abs"}));
}

MisLevel level_of(const std::string& s) {
  return s == "sequence" ? MisLevel::Sequence : s == "geometric" ? MisLevel::Geometric : MisLevel::Token;
}

TEST(MismatchCorrection, MisEqualsSlimesComputeMisWeights) {
  const auto path = std::filesystem::path(SLIMPI_SOURCE_DIR) / "tests/fixtures/mis/cases.json";
  const nlohmann::json cases = nlohmann::json::parse(std::ifstream(path))["cases"];
  ASSERT_EQ(cases.size(), 10u);
  for (const auto& c : cases) {
    const nlohmann::json& st = c["setting"];
    MismatchConfig cfg;
    cfg.function = TisFunction::Mis;
    cfg.level = level_of(st["level"]);
    const std::string mode = st["mode"];
    cfg.mode = mode == "clip" ? MisMode::Clip : mode == "mask" ? MisMode::Mask : MisMode::Truncate;
    cfg.lower = st["lower"];
    cfg.upper = st["upper"];
    cfg.rs = st.value("rs", false);
    cfg.rs_level = level_of(st.value("rs_level", "token"));
    cfg.rs_lower = st.contains("rs_lower") ? st["rs_lower"].get<double>() : cfg.lower;
    cfg.rs_upper = st.contains("rs_upper") ? st["rs_upper"].get<double>() : cfg.upper;
    cfg.rs_veto = st.value("rs_veto", 0.0);
    cfg.batch_normalize = st.value("batch_normalize", false);
    std::vector<int64_t> seg;
    const auto lengths = c["lengths"].get<std::vector<int64_t>>();
    for (size_t i = 0; i < lengths.size(); ++i) seg.insert(seg.end(), lengths[i], int64_t(i));
    const MismatchCorrection got = mismatch_correction(
        vec(c["train"].get<std::vector<float>>()), vec(c["rollout"].get<std::vector<float>>()),
        vec(c["mask"].get<std::vector<float>>()), at::tensor(seg, at::kLong), int64_t(lengths.size()), cfg);
    const std::string where = st.dump();
    expect_close(got.weight, c["weight"].get<std::vector<float>>(), where + " weight");
    expect_close(got.keep, c["keep"].get<std::vector<float>>(), where + " keep");
    std::vector<std::string> want_names;
    for (const auto& [name, values] : c["metrics"].items()) want_names.push_back(name);
    std::vector<std::string> names = mismatch_metric_names(cfg);
    std::vector<std::string> sorted_names = names;
    std::sort(sorted_names.begin(), sorted_names.end());
    EXPECT_EQ(sorted_names, want_names) << where;
    auto m = as_map(got);
    ASSERT_EQ(got.metrics.size(), names.size()) << where;
    for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(got.metrics[i].first, names[i]) << where;
    for (const auto& [name, values] : c["metrics"].items())
      if (m.count(name)) expect_close(m[name], values.get<std::vector<float>>(), where + " " + name, 2e-5);
  }
}

}  // namespace
}  // namespace slimpi
