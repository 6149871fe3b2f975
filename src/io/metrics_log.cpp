#include "io/metrics_log.h"

#include <slimpi/error.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/file_write.h"
#include "io/h5_meta.h"
#include "parallel/mpi_bytes.h"
#include "parallel/watchdog.h"

namespace slimpi {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string join_lines(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += n + "\n";
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1)
    out.push_back(text.substr(start, end - start));
  return out;
}

// Rank 0's names and values, the same on every rank afterwards.
void broadcast_row(MPI_Comm comm, std::vector<std::string>& names, std::vector<double>& values) {
  std::string text = join_lines(names);
  if (comm == MPI_COMM_NULL) return;
  broadcast_string(comm, text, 0);
  names = split_lines(text);
  values.resize(names.size());
  static const std::string context = "[metrics.h5] rank 0's row";
  WaitGuard guard({&context, "MPI_Bcast", values.size(), "f64", 0});
  MPI_Bcast(values.data(), static_cast<int>(values.size()), MPI_DOUBLE, 0, comm);
}

// A logged value as text: non-finite values as nan / inf / -inf (an empty cell means
// "not logged this step").
std::string csv_number(double v) { return std::isnan(v) ? "nan" : fmt::format("{}", v); }

}  // namespace

MetricsLog::MetricsLog(const std::string& dir, MPI_Comm comm, const std::string& deck_text)
    : file_(h5::File::create(dir + "/metrics.h5", comm)), csv_path_(dir + "/metrics.csv") {
  if (comm != MPI_COMM_NULL) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
  }
  h5::write_file_meta(file_, "slimpi metrics", deck_text);
  steps_group_ = h5::create_group(file_.id(), "steps");
  ranks_group_ = h5::create_group(file_.id(), "ranks");
  step_ = h5::AppendableDataset<int64_t>::create(file_, steps_group_.id(), "step", {}, 1024);
  rank_step_ = h5::AppendableDataset<int64_t>::create(file_, ranks_group_.id(), "step", {}, 1024);
  rank_rank_ = h5::AppendableDataset<int64_t>::create(file_, ranks_group_.id(), "rank", {}, 1024);
  h5::write_attr(steps_group_.id(), "columns", std::string());
  if (rank_ == 0) write_csv(/*rewrite=*/true);
}

MetricsLog::MetricsLog(const std::string& dir, MPI_Comm comm, ResumeAt resume)
    : file_(h5::File::open(dir + "/metrics.h5", /*writable=*/true, comm)), csv_path_(dir + "/metrics.csv") {
  if (comm != MPI_COMM_NULL) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
  }
  steps_group_ = h5::open_group(file_.id(), "steps");
  ranks_group_ = h5::open_group(file_.id(), "ranks");
  step_ = h5::AppendableDataset<int64_t>::open(file_, steps_group_.id(), "step");
  rank_step_ = h5::AppendableDataset<int64_t>::open(file_, ranks_group_.id(), "step");
  rank_rank_ = h5::AppendableDataset<int64_t>::open(file_, ranks_group_.id(), "rank");
  names_ = split_lines(h5::read_attr_string(steps_group_.id(), "columns"));
  for (const auto& n : names_) columns_.emplace(n, h5::AppendableDataset<double>::open(file_, steps_group_.id(), n));
  if (h5::has_attr(ranks_group_.id(), "columns"))
    for (const auto& n : split_lines(h5::read_attr_string(ranks_group_.id(), "columns")))
      rank_columns_.emplace(n, h5::AppendableDataset<double>::open(file_, ranks_group_.id(), n));

  // Rows are in step order: keep those before the resume step.
  auto first_at = [&](const h5::AppendableDataset<int64_t>& steps) {
    const std::vector<int64_t> v = steps.read();
    return uint64_t(std::lower_bound(v.begin(), v.end(), resume.step) - v.begin());
  };
  const uint64_t keep = first_at(step_);
  const uint64_t keep_ranks = first_at(rank_step_);
  std::vector<int64_t> kept_steps = step_.read(0, keep);
  step_.truncate_to(keep);
  std::vector<std::vector<double>> values;
  for (const auto& n : names_) {
    values.push_back(columns_.at(n).read(0, keep));
    columns_.at(n).truncate_to(keep);
  }
  rank_step_.truncate_to(keep_ranks);
  rank_rank_.truncate_to(keep_ranks);
  for (auto& [n, col] : rank_columns_) col.truncate_to(keep_ranks);
  file_.flush();
  if (rank_ == 0) {
    for (uint64_t i = 0; i < keep; ++i) {
      std::map<std::string, double> row;
      for (size_t c = 0; c < names_.size(); ++c)
        if (!std::isnan(values[c][i])) row[names_[c]] = values[c][i];
      rows_.emplace_back(kept_steps[i], std::move(row));
    }
    write_csv(/*rewrite=*/true);
  }
}

h5::AppendableDataset<double>& MetricsLog::column(const std::string& name) {
  auto it = columns_.find(name);
  if (it != columns_.end()) return it->second;
  // A new column: collective creation (every rank reaches here for the same names in
  // the same order), backfilled with NaN for the rows logged before it existed.
  SLIMPI_CHECK(!name.empty() && name != "step" && name.front() != '/' && name.back() != '/',
               "metric name '{}' cannot be a metrics.h5 column", name);
  for (const auto& other : names_)  // "a/b" nests under "a": a column cannot also be a group
    SLIMPI_CHECK(name.rfind(other + "/", 0) != 0 && other.rfind(name + "/", 0) != 0,
                 "metric names '{}' and '{}' collide in metrics.h5 (one would be a group of the other)", name, other);
  auto col = h5::AppendableDataset<double>::create(file_, steps_group_.id(), name, {}, 1024, kNaN);
  col.grow_to(step_.n_rows());
  names_.push_back(name);
  h5::write_attr(steps_group_.id(), "columns", join_lines(names_));
  return columns_.emplace(name, std::move(col)).first->second;
}

void MetricsLog::log_step(int64_t step, const std::map<std::string, double>& values) {
  std::vector<std::string> names;
  std::vector<double> vals;
  for (const auto& [k, v] : values) {
    names.push_back(k);
    vals.push_back(v);
  }
  broadcast_row(file_.comm(), names, vals);
  const size_t old_columns = names_.size();
  for (const auto& n : names) column(n);

  const bool root = rank_ == 0;
  step_.append(&step, root ? 1 : 0);
  std::map<std::string, double> row;
  for (size_t i = 0; i < names.size(); ++i) row[names[i]] = vals[i];
  for (const auto& n : names_) {
    auto it = row.find(n);
    double v = it == row.end() ? kNaN : it->second;
    columns_.at(n).append(&v, root ? 1 : 0);
  }
  file_.flush();
  if (root) {
    rows_.emplace_back(step, std::move(row));
    write_csv(/*rewrite=*/names_.size() != old_columns);
  }
}

void MetricsLog::log_ranks(int64_t step, const std::map<std::string, double>& mine) {
  std::vector<std::string> names, local_names;
  std::vector<double> unused;
  for (const auto& [k, v] : mine) names.push_back(k);
  local_names = names;
  broadcast_row(file_.comm(), names, unused);
  SLIMPI_CHECK(names == local_names, "log_ranks: rank {} has metrics [{}], rank 0 has [{}]", rank_,
               join_lines(local_names), join_lines(names));
  int64_t rank = rank_;
  rank_step_.append(&step, 1);
  rank_rank_.append(&rank, 1);
  for (const auto& [k, v] : mine) {
    auto it = rank_columns_.find(k);
    if (it == rank_columns_.end()) {
      // A late column: the rows of earlier steps read NaN.
      auto col = h5::AppendableDataset<double>::create(file_, ranks_group_.id(), k, {}, 1024, kNaN);
      col.grow_to(rank_step_.n_rows() - static_cast<uint64_t>(size_));
      it = rank_columns_.emplace(k, std::move(col)).first;
      std::string names;
      for (const auto& [name, unused_col] : rank_columns_) names += name + "\n";
      h5::write_attr(ranks_group_.id(), "columns", names);
    }
    it->second.append(&v, 1);
  }
  file_.flush();
}

void MetricsLog::write_csv(bool rewrite) {
  std::string text;
  auto write_row = [&](int64_t step, const std::map<std::string, double>& row) {
    text += std::to_string(step);
    for (const auto& n : names_) {
      auto it = row.find(n);
      text += ',' + (it == row.end() ? std::string() : csv_number(it->second));
    }
    text += '\n';
  };
  if (rewrite) {
    text += "step";
    for (const auto& n : names_) text += ',' + n;
    text += '\n';
    for (const auto& [step, row] : rows_) write_row(step, row);
  } else {
    write_row(rows_.back().first, rows_.back().second);
  }
  FileWriter out(csv_path_, rewrite ? FileWriter::Mode::Truncate : FileWriter::Mode::Append);
  out.write(text);
  out.close();
}

}  // namespace slimpi
