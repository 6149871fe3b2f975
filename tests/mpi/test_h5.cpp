// Parallel HDF5 at np 1, 2, 4: collective appends with uneven (and empty) per-rank
// counts land in rank order; CSR rows; the rollout log round-trips every field.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <slimpi/error.h>

#include "io/appendable_dataset.h"
#include "io/rollout_log.h"
#include "io/tensor_io.h"
#include "shared_tmp.h"

namespace slimpi {
namespace {

using testing::SharedTmpDir;

int rank_of_world() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int size_of_world() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
// Rows rank `r` appends in round `k`: uneven, and zero for some ranks in some rounds.
int64_t rows_of(int r, int k) { return (r + k) % 3 == 0 ? 0 : r + 2 * k + 1; }
// The value of element `e` of row `i` of rank `r` in round `k`.
double value_of(int r, int k, int64_t i, int e) { return 1000.0 * k + 100.0 * r + i + 0.25 * e; }

TEST(H5, CollectiveAppendsLandInRankOrderAndReadBackValueByValue) {
  SharedTmpDir tmp;
  const int r = rank_of_world(), n = size_of_world();
  const int rounds = 4;
  {
    h5::File f = h5::File::create(tmp.file("a.h5"), MPI_COMM_WORLD);
    auto scalars = h5::AppendableDataset<double>::create(f, f.id(), "scalars", {}, 3);
    auto pairs = h5::AppendableDataset<float>::create(f, f.id(), "group/pairs", {2}, 5);
    for (int k = 0; k < rounds; ++k) {
      std::vector<double> s;
      std::vector<float> p;
      for (int64_t i = 0; i < rows_of(r, k); ++i) {
        s.push_back(value_of(r, k, i, 0));
        p.push_back(float(value_of(r, k, i, 0)));
        p.push_back(float(value_of(r, k, i, 1)));
      }
      uint64_t before = scalars.n_rows();
      uint64_t first = scalars.append(s.data(), rows_of(r, k));
      pairs.append(p.data(), rows_of(r, k));
      uint64_t expected_first = before;
      for (int q = 0; q < r; ++q) expected_first += rows_of(q, k);
      EXPECT_EQ(first, expected_first);
    }
  }
  // Every rank re-reads the whole file (serially) and checks every element.
  h5::File f = h5::File::open(tmp.file("a.h5"), false, MPI_COMM_NULL);
  auto scalars = h5::AppendableDataset<double>::open(f, f.id(), "scalars");
  auto pairs = h5::AppendableDataset<float>::open(f, f.id(), "group/pairs");
  std::vector<double> s = scalars.read();
  std::vector<float> p = pairs.read();
  size_t row = 0;
  for (int k = 0; k < rounds; ++k)
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < rows_of(q, k); ++i, ++row) {
        ASSERT_LT(row, s.size());
        ASSERT_EQ(s[row], value_of(q, k, i, 0)) << "row " << row;
        ASSERT_EQ(p[2 * row], float(value_of(q, k, i, 0)));
        ASSERT_EQ(p[2 * row + 1], float(value_of(q, k, i, 1)));
      }
  EXPECT_EQ(row, s.size());
  EXPECT_EQ(pairs.n_rows(), s.size());
  EXPECT_EQ(pairs.row_size(), 2u);
}

TEST(H5, CsrRowsFromAllRanks) {
  SharedTmpDir tmp;
  const int r = rank_of_world(), n = size_of_world();
  {
    h5::File f = h5::File::create(tmp.file("csr.h5"), MPI_COMM_WORLD);
    auto csr = h5::CsrDataset<int32_t>::create(f, f.id(), "tokens", 7);
    for (int k = 0; k < 3; ++k) {
      // Rank r appends r + k rows; row j of it has length (r + j + k) % 4 (some empty).
      std::vector<int64_t> lengths;
      std::vector<int32_t> values;
      for (int j = 0; j < r + k; ++j) {
        lengths.push_back((r + j + k) % 4);
        for (int e = 0; e < lengths.back(); ++e) values.push_back(10000 * k + 1000 * r + 10 * j + e);
      }
      csr.append(values.data(), lengths.data(), lengths.size());
    }
  }
  h5::File f = h5::File::open(tmp.file("csr.h5"), false, MPI_COMM_NULL);
  auto csr = h5::CsrDataset<int32_t>::open(f, f.id(), "tokens");
  std::vector<int64_t> offsets = csr.read_offsets();
  EXPECT_EQ(offsets.front(), 0);
  uint64_t row = 0;
  for (int k = 0; k < 3; ++k)
    for (int q = 0; q < n; ++q)
      for (int j = 0; j < q + k; ++j, ++row) {
        std::vector<int32_t> got = csr.read_row(row);
        ASSERT_EQ(got.size(), size_t((q + j + k) % 4)) << "row " << row;
        for (size_t e = 0; e < got.size(); ++e) ASSERT_EQ(got[e], int32_t(10000 * k + 1000 * q + 10 * j + e));
      }
  EXPECT_EQ(csr.n_rows(), row);
  EXPECT_EQ(uint64_t(offsets.back()), csr.n_values());
}

Sample make_sample(int r, int step, int j) {
  Sample s;
  s.step = step;
  s.group_index = r;
  s.index = j;
  s.tokens = std::vector<int64_t>(3 + j, 7 + r);
  s.prompt_length = 3 + j;
  s.tokens.insert(s.tokens.end(), j + step, 11 * r + j);
  for (int64_t t = 0; t < s.response_length(); ++t) {
    s.rollout_log_probs.push_back(-0.125f * (t + 1) - r);
    s.weight_versions.push_back(step);
    s.sampling_support.push_back(int32_t(t % 3));
    // Training fields on some samples only (the others' rows stay empty).
    if (j % 2 == 0) {
      s.old_log_probs.push_back(-0.25f * t);
      s.raw_advantages.push_back(float(r) - 1.5f);
      s.advantages.push_back(float(r) - 1.5f + 0.5f * t);
    }
    if (r % 2 == 1) {
      s.ref_log_probs.push_back(-0.5f * t);
      s.kl.push_back(0.0625f * t);
    }
  }
  if (s.response_length() >= 3) s.context_starts = {1, s.response_length() - 1};  // a split trajectory
  s.reward = 0.5f * j;
  s.raw_reward = float(j);
  s.status = j % 2 ? SampleStatus::Truncated : SampleStatus::Completed;
  return s;
}

TEST(H5, RolloutLogRoundTripsEverySampleOnce) {
  SharedTmpDir tmp;
  const int r = rank_of_world(), n = size_of_world();
  {
    RolloutLog log = RolloutLog::create(tmp.file("rollouts.h5"), MPI_COMM_WORLD, "[run]\nname = \"t\"\n");
    for (int step = 0; step < 3; ++step) {
      std::vector<Sample> mine;
      for (int j = 0; j < (r + step) % 3; ++j) mine.push_back(make_sample(r, step, j));
      log.append(mine);
    }
  }
  RolloutLog log = RolloutLog::open(tmp.file("rollouts.h5"), MPI_COMM_NULL, /*writable=*/false);
  std::vector<Sample> all = log.read_all();
  size_t i = 0;
  for (int step = 0; step < 3; ++step)
    for (int q = 0; q < n; ++q)
      for (int j = 0; j < (q + step) % 3; ++j, ++i) {
        ASSERT_LT(i, all.size());
        Sample e = make_sample(q, step, j);
        const Sample& g = all[i];
        EXPECT_EQ(g.step, e.step);
        EXPECT_EQ(g.group_index, e.group_index);
        EXPECT_EQ(g.index, e.index);
        EXPECT_EQ(g.tokens, e.tokens);
        EXPECT_EQ(g.prompt_length, e.prompt_length);
        EXPECT_EQ(g.rollout_log_probs, e.rollout_log_probs);
        EXPECT_EQ(g.sampling_support, e.sampling_support);
        EXPECT_EQ(g.weight_versions, e.weight_versions);
        EXPECT_EQ(g.context_starts, e.context_starts);
        EXPECT_EQ(g.old_log_probs, e.old_log_probs);
        EXPECT_EQ(g.ref_log_probs, e.ref_log_probs);
        EXPECT_EQ(g.kl, e.kl);
        EXPECT_EQ(g.raw_advantages, e.raw_advantages);
        EXPECT_EQ(g.advantages, e.advantages);
        EXPECT_EQ(g.reward, e.reward);
        EXPECT_EQ(g.raw_reward, e.raw_reward);
        EXPECT_EQ(g.status, e.status);
        EXPECT_EQ(g.weight_version(), e.weight_version());
      }
  EXPECT_EQ(i, all.size());
  h5::File f = h5::File::open(tmp.file("rollouts.h5"), false, MPI_COMM_NULL);
  EXPECT_EQ(h5::read_attr_string(f.id(), "kind"), "slimpi rollouts");
  EXPECT_EQ(h5::read_attr_string(f.id(), "deck"), "[run]\nname = \"t\"\n");
}

TEST(H5, ErrorsCarryHdf5sMessage) {
  try {
    h5::File::open("/nonexistent/dir/x.h5", false, MPI_COMM_NULL);
    FAIL() << "opened a missing file";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("HDF5: open file /nonexistent/dir/x.h5 failed: "), std::string::npos) << what;
    EXPECT_NE(what.find("unable to open file"), std::string::npos) << what;
  }
}

// A checkpoint tensor without its dtype attribute (a file edited by hand, or not slimpi's)
// is named, not reported as HDF5's attribute error; a dtype h5py writes (a variable-length
// str) reads like slimpi's own.
TEST(H5, TensorWithoutDtypeIsNamed) {
  SharedTmpDir tmp;
  const std::string path = tmp.file("tensors" + std::to_string(rank_of_world()) + ".h5");
  {
    h5::File f = h5::File::create(path, MPI_COMM_NULL);
    const hsize_t n = 3;
    h5::Handle space(h5::check(H5Screate_simple(1, &n, nullptr), "H5Screate_simple"), H5Sclose);
    h5::Handle d(h5::check(H5Dcreate2(f.id(), "bare", H5T_IEEE_F32LE, space.id(), H5P_DEFAULT, H5P_DEFAULT,
                                      H5P_DEFAULT), "H5Dcreate2"),
                 H5Dclose);
    h5::Handle vd(h5::check(H5Dcreate2(f.id(), "vlen", H5T_IEEE_F32LE, space.id(), H5P_DEFAULT, H5P_DEFAULT,
                                       H5P_DEFAULT), "H5Dcreate2"),
                  H5Dclose);
    const float values[3] = {1, 2, 3};
    h5::check_status(H5Dwrite(vd.id(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values), "H5Dwrite");
    h5::Handle str(h5::check(H5Tcopy(H5T_C_S1), "H5Tcopy"), H5Tclose);
    h5::check_status(H5Tset_size(str.id(), H5T_VARIABLE), "H5Tset_size");
    h5::check_status(H5Tset_cset(str.id(), H5T_CSET_UTF8), "H5Tset_cset");
    h5::Handle scalar(h5::check(H5Screate(H5S_SCALAR), "H5Screate"), H5Sclose);
    h5::Handle attr(h5::check(H5Acreate2(vd.id(), "dtype", str.id(), scalar.id(), H5P_DEFAULT, H5P_DEFAULT),
                              "H5Acreate2"),
                    H5Aclose);
    const char* text = "float32";
    h5::check_status(H5Awrite(attr.id(), str.id(), &text), "H5Awrite");
  }
  h5::File f = h5::File::open(path, false, MPI_COMM_NULL);
  try {
    read_tensor(f.id(), "bare");
    FAIL() << "read a tensor without dtype";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor bare has no 'dtype' attribute"), std::string::npos) << e.what();
  }
  const at::Tensor t = read_tensor(f.id(), "vlen");
  ASSERT_EQ(t.numel(), 3);
  EXPECT_EQ(t[2].item<float>(), 3.0f);
}

TEST(H5, LogProbCountMustMatchResponse) {
  SharedTmpDir tmp;
  RolloutLog log = RolloutLog::create(tmp.file("bad" + std::to_string(rank_of_world()) + ".h5"), MPI_COMM_NULL, "");
  Sample s = make_sample(0, 1, 1);
  s.rollout_log_probs.push_back(0.0f);
  EXPECT_THROW(log.append({s}), Error);
}

}  // namespace
}  // namespace slimpi
