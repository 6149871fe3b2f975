// MetricsLog — metrics.h5 and metrics.csv of a run: one row per step, one column per
// metric, columns created on first use (earlier rows read NaN / empty in the CSV).
// Owned by the driver; every call is collective over the file's communicator.
//
// metrics.h5:
//   /steps/step                 int64 [n_steps]
//   /steps/<metric name>        float64 [n_steps]; names with '/' nest ("train/loss")
//   /steps attribute `columns`  the metric names in order of first use, one per line
//   /ranks/{step,rank,<name>}   one row per rank per step: each rank's own values
//                               (phase timings), for stragglers and scaling studies;
//                               attribute `columns` as on /steps
// metrics.csv: header "step,<metric>,...", one line per step (rank 0 writes it; the
// file is rewritten whole when a column appears, else appended and flushed).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "io/appendable_dataset.h"

namespace slimpi {

class MetricsLog {
 public:
  // Creates (truncates) dir/metrics.h5 and dir/metrics.csv.
  MetricsLog(const std::string& dir, MPI_Comm comm, const std::string& deck_text);
  // Reopens the files of a run that resumes at step `resume_step`: rows of that step
  // and later (written after the checkpoint) are dropped, metrics.csv is rewritten.
  struct ResumeAt {
    int64_t step;
  };
  MetricsLog(const std::string& dir, MPI_Comm comm, ResumeAt resume);

  // Row `step` with rank 0's values (other ranks' `values` are ignored: reduce first).
  void log_step(int64_t step, const std::map<std::string, double>& values);
  // One row per rank with each rank's own values; every rank must pass the same names.
  void log_ranks(int64_t step, const std::map<std::string, double>& mine);

  const std::vector<std::string>& columns() const { return names_; }
  uint64_t n_rows() const { return step_.n_rows(); }
  std::string csv_path() const { return csv_path_; }
  std::string h5_path() const { return file_.path(); }

 private:
  h5::AppendableDataset<double>& column(const std::string& name);
  void write_csv(bool rewrite);

  h5::File file_;
  h5::Handle steps_group_, ranks_group_;
  h5::AppendableDataset<int64_t> step_;
  std::vector<std::string> names_;  // column order
  std::map<std::string, h5::AppendableDataset<double>> columns_;
  h5::AppendableDataset<int64_t> rank_step_, rank_rank_;
  std::map<std::string, h5::AppendableDataset<double>> rank_columns_;
  int rank_ = 0;
  int size_ = 1;
  std::string csv_path_;
  std::vector<std::pair<int64_t, std::map<std::string, double>>> rows_;  // rank 0: for CSV rewrites
};

}  // namespace slimpi
