// AppendableDataset<T> — an HDF5 dataset whose first dimension grows by appends from
// every rank at once (chunked, unlimited first dimension; fixed trailing `row_shape`).
//
// append() is collective over the file's communicator: the ranks' rows land in rank
// order after the current end (offsets from one exchange of counts, plan_appends; one
// set_extent, one collective write). Every rank keeps the same n_rows(). In a serial
// file it is a plain append.
// Instantiated for float, double, int8, uint8, int32, int64.
#pragma once

#include <optional>

#include "io/h5.h"

namespace slimpi::h5 {

// Where one rank's rows go in a collective append whose rows arrive in `parts` (e.g. a
// step's trained samples, then its unused ones): part p of every rank, in rank order,
// then part p + 1. Offsets are relative to the dataset's end before the append. Plans
// for many datasets come from one exchange (plan_appends), so an append of many
// columns costs one MPI_Allgather plus one set_extent and one write per dataset.
struct AppendPlan {
  std::vector<uint64_t> first;  // [parts] this rank's first row of each part
  std::vector<uint64_t> count;  // [parts] this rank's rows of each part
  uint64_t total = 0;           // rows all ranks append
  uint64_t local() const;       // this rank's rows, all parts
};

// counts[k][p]: this rank's rows of part p in quantity k (e.g. k = 0 rows, k = 1 token
// values). Collective over `comm` (MPI_COMM_NULL: this process alone). Returns one plan
// per quantity.
std::vector<AppendPlan> plan_appends(MPI_Comm comm, const std::vector<std::vector<uint64_t>>& counts);

template <class T>
class AppendableDataset {
 public:
  // Collective in a parallel file. A `name` with '/' creates the groups on its path.
  // `fill` is what rows hold before they are written
  // (e.g. NaN for a metric column that appears late).
  static AppendableDataset create(const File& file, hid_t loc, const std::string& name,
                                  std::vector<hsize_t> row_shape = {}, hsize_t chunk_rows = 8192,
                                  std::optional<T> fill = std::nullopt);
  static AppendableDataset open(const File& file, hid_t loc, const std::string& name);

  uint64_t n_rows() const { return n_rows_; }
  // Elements per row (product of row_shape; 1 for a scalar row).
  uint64_t row_size() const;
  hid_t id() const { return dset_.id(); }
  MPI_Comm comm() const { return comm_; }

  // Appends n_local rows (n_local * row_size() elements at `rows`) from this rank.
  // Collective. Returns the global index of this rank's first new row.
  uint64_t append(const T* rows, uint64_t n_local);
  // Collective: appends this rank's plan.local() rows (its parts back to back at
  // `rows`) where `plan` puts them. Every rank passes its own plan of one exchange.
  void append(const T* rows, const AppendPlan& plan);
  // Collective: grows to `n` rows without writing them (they read as the fill value).
  void grow_to(uint64_t n);
  // Collective: drops every row from `n` on (resuming from a checkpoint). n <= n_rows().
  void truncate_to(uint64_t n);
  // Reads rows [first, first + count) (all rows by default). Independent, any rank.
  std::vector<T> read(uint64_t first = 0, std::optional<uint64_t> count = std::nullopt) const;

 private:
  Handle dset_;
  Handle dxpl_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  std::string where_;      // "dataset 'step' of runs/x/metrics.h5": waits and errors name it
  std::string file_path_;  // the watchdog asks its file system for space (parallel/watchdog.h)
  std::vector<hsize_t> row_shape_;
  uint64_t n_rows_ = 0;
};

// CsrDataset<T> — variable-length rows as two appendable datasets in a group `name`:
// `values` (all rows back to back) and `offsets` (n_rows + 1 entries; row i is
// values[offsets[i] : offsets[i+1]]). Parallel HDF5 cannot write variable-length types;
// this layout is what h5py users slice directly.
template <class T>
class CsrDataset {
 public:
  static CsrDataset create(const File& file, hid_t loc, const std::string& name, hsize_t chunk_values = 65536);
  static CsrDataset open(const File& file, hid_t loc, const std::string& name);

  uint64_t n_rows() const { return offsets_.n_rows() - 1; }
  uint64_t n_values() const { return values_.n_rows(); }
  // Collective: appends this rank's rows (row r has lengths[r] values, back to back in
  // `values`). Rows of lower ranks come first. Returns this rank's first row index.
  uint64_t append(const T* values, const int64_t* lengths, uint64_t n_local_rows);
  // Collective: this rank's rows (parts back to back: `lengths` per row, `values`)
  // placed by `rows` (a plan of rows) and `values_plan` (a plan of values, same parts).
  void append(const T* values, const int64_t* lengths, const AppendPlan& rows, const AppendPlan& values_plan);
  // Collective: keeps rows [0, n) and their values.
  void truncate_to(uint64_t n_rows);
  // Independent reads.
  std::vector<int64_t> read_offsets() const { return offsets_.read(); }
  std::vector<T> read_values() const { return values_.read(); }
  // The values of rows [first, first + n) given the column's offsets: a slice, not the column.
  std::vector<T> read_values(const std::vector<int64_t>& offsets, uint64_t first, uint64_t n) const {
    return values_.read(uint64_t(offsets[first]), uint64_t(offsets[first + n] - offsets[first]));
  }
  std::vector<T> read_row(uint64_t row) const;

 private:
  Handle group_;
  AppendableDataset<T> values_;
  AppendableDataset<int64_t> offsets_;
};

}  // namespace slimpi::h5
