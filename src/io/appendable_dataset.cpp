#include "io/appendable_dataset.h"

#include <slimpi/error.h>

#include <numeric>

#include "parallel/watchdog.h"

namespace slimpi::h5 {

uint64_t AppendPlan::local() const { return std::accumulate(count.begin(), count.end(), uint64_t(0)); }

std::vector<AppendPlan> plan_appends(MPI_Comm comm, const std::vector<std::vector<uint64_t>>& counts) {
  std::vector<uint64_t> mine;  // [quantities x parts]
  for (const auto& c : counts) mine.insert(mine.end(), c.begin(), c.end());
  int rank = 0, size = 1;
  std::vector<uint64_t> all = mine;  // [ranks x quantities x parts]
  if (comm != MPI_COMM_NULL) {
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    all.resize(mine.size() * size_t(size));
    static const std::string context = "(HDF5 file)";
    WaitGuard guard({&context, "row counts for a collective append (allgather)"});
    MPI_Allgather(mine.data(), int(mine.size()), MPI_UINT64_T, all.data(), int(mine.size()), MPI_UINT64_T, comm);
  }
  std::vector<AppendPlan> plans;
  size_t at = 0;
  for (const auto& c : counts) {
    AppendPlan plan;
    plan.count = c;
    for (size_t p = 0; p < c.size(); ++p) {
      uint64_t before = plan.total;  // rows of earlier parts (all ranks) and of lower ranks in this part
      for (int r = 0; r < size; ++r) {
        const uint64_t n = all[size_t(r) * mine.size() + at + p];
        if (r < rank) before += n;
        plan.total += n;
      }
      plan.first.push_back(before);
    }
    at += c.size();
    plans.push_back(std::move(plan));
  }
  return plans;
}

template <class T>
AppendableDataset<T> AppendableDataset<T>::create(const File& file, hid_t loc, const std::string& name,
                                                  std::vector<hsize_t> row_shape, hsize_t chunk_rows,
                                                  std::optional<T> fill) {
  AppendableDataset d;
  d.comm_ = file.comm();
  d.name_ = name;
  d.where_ = fmt::format("dataset '{}' of {}", name, file.path());
  d.file_path_ = file.path();
  d.row_shape_ = std::move(row_shape);
  std::vector<hsize_t> dims{0}, max_dims{H5S_UNLIMITED}, chunk{chunk_rows};
  for (hsize_t s : d.row_shape_) {
    dims.push_back(s);
    max_dims.push_back(s);
    chunk.push_back(s);
  }
  Handle space(check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), max_dims.data()), "H5Screate"),
               H5Sclose);
  Handle dcpl(check(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate(dcpl)"), H5Pclose);
  check_status(H5Pset_chunk(dcpl.id(), static_cast<int>(chunk.size()), chunk.data()), "H5Pset_chunk");
  if (fill) {
    check_status(H5Pset_fill_value(dcpl.id(), native_type<T>(), &*fill), "H5Pset_fill_value");
    check_status(H5Pset_fill_time(dcpl.id(), H5D_FILL_TIME_ALLOC), "H5Pset_fill_time");
  } else {
    check_status(H5Pset_fill_time(dcpl.id(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
  }
  // Names with '/' ("train/loss") make their groups on the way.
  Handle lcpl(check(H5Pcreate(H5P_LINK_CREATE), "H5Pcreate(lcpl)"), H5Pclose);
  check_status(H5Pset_create_intermediate_group(lcpl.id(), 1), "H5Pset_create_intermediate_group");
  d.dset_ = Handle(check(H5Dcreate2(loc, name.c_str(), native_type<T>(), space.id(), lcpl.id(), dcpl.id(),
                                    H5P_DEFAULT),
                         ("create dataset " + name).c_str()),
                   H5Dclose);
  d.dxpl_ = transfer_list(file);
  return d;
}

template <class T>
AppendableDataset<T> AppendableDataset<T>::open(const File& file, hid_t loc, const std::string& name) {
  AppendableDataset d;
  d.comm_ = file.comm();
  d.name_ = name;
  d.where_ = fmt::format("dataset '{}' of {}", name, file.path());
  d.file_path_ = file.path();
  d.dset_ = Handle(check(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), ("open dataset " + name).c_str()), H5Dclose);
  Handle space(check(H5Dget_space(d.dset_.id()), "H5Dget_space"), H5Sclose);
  int rank = H5Sget_simple_extent_ndims(space.id());
  SLIMPI_CHECK(rank >= 1, "HDF5 dataset '{}' is a scalar, not an appendable dataset", name);
  std::vector<hsize_t> dims(rank);
  check_status(H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr), "H5Sget_simple_extent_dims");
  d.n_rows_ = dims[0];
  d.row_shape_.assign(dims.begin() + 1, dims.end());
  d.dxpl_ = transfer_list(file);
  return d;
}

template <class T>
uint64_t AppendableDataset<T>::row_size() const {
  return std::accumulate(row_shape_.begin(), row_shape_.end(), uint64_t(1), std::multiplies<>());
}

template <class T>
void AppendableDataset<T>::grow_to(uint64_t n) {
  WaitGuard guard({&where_, "(HDF5): collective set_extent", 0, "", -1, &file_path_});
  std::vector<hsize_t> dims{n};
  dims.insert(dims.end(), row_shape_.begin(), row_shape_.end());
  check_status(H5Dset_extent(dset_.id(), dims.data()), ("H5Dset_extent of " + where_).c_str());
  n_rows_ = n;
}

template <class T>
void AppendableDataset<T>::truncate_to(uint64_t n) {
  SLIMPI_CHECK(n <= n_rows_, "cannot truncate '{}' to {} rows: it has {}", name_, n, n_rows_);
  grow_to(n);
}

template <class T>
uint64_t AppendableDataset<T>::append(const T* rows, uint64_t n_local) {
  const AppendPlan plan = plan_appends(comm_, {{n_local}}).front();
  const uint64_t first = n_rows_ + plan.first.front();
  append(rows, plan);
  return first;
}

template <class T>
void AppendableDataset<T>::append(const T* rows, const AppendPlan& plan) {
  if (plan.total == 0) return;
  const uint64_t end = n_rows_;
  grow_to(n_rows_ + plan.total);
  Handle file_space(check(H5Dget_space(dset_.id()), "H5Dget_space"), H5Sclose);
  const uint64_t n_local = plan.local();
  std::vector<hsize_t> mem_dims{std::max<hsize_t>(n_local, 1)};
  mem_dims.insert(mem_dims.end(), row_shape_.begin(), row_shape_.end());
  Handle mem_space(check(H5Screate_simple(static_cast<int>(mem_dims.size()), mem_dims.data(), nullptr), "H5Screate"),
                   H5Sclose);
  bool selected = false;  // the union of this rank's parts (SET the first, OR the others)
  for (size_t p = 0; p < plan.count.size(); ++p) {
    if (plan.count[p] == 0) continue;
    std::vector<hsize_t> start{end + plan.first[p]}, count{plan.count[p]};
    for (hsize_t s : row_shape_) {
      start.push_back(0);
      count.push_back(s);
    }
    check_status(H5Sselect_hyperslab(file_space.id(), selected ? H5S_SELECT_OR : H5S_SELECT_SET, start.data(),
                                     nullptr, count.data(), nullptr),
                 "H5Sselect_hyperslab");
    selected = true;
  }
  if (!selected) check_status(H5Sselect_none(file_space.id()), "H5Sselect_none");
  if (n_local == 0) check_status(H5Sselect_none(mem_space.id()), "H5Sselect_none");
  T dummy{};
  WaitGuard guard({&where_, "(HDF5): collective write", 0, "", -1, &file_path_});
  check_status(H5Dwrite(dset_.id(), native_type<T>(), mem_space.id(), file_space.id(), dxpl_.id(),
                        n_local ? rows : &dummy),
               ("H5Dwrite of " + where_).c_str());
}

template <class T>
std::vector<T> AppendableDataset<T>::read(uint64_t first, std::optional<uint64_t> count) const {
  uint64_t n = count.value_or(n_rows_ - std::min(first, n_rows_));
  SLIMPI_CHECK(first + n <= n_rows_, "read of rows [{}, {}) beyond the {} rows of '{}'", first, first + n, n_rows_,
               name_);
  std::vector<T> out(n * row_size());
  if (n == 0) return out;
  std::vector<hsize_t> start{first}, cnt{n};
  for (hsize_t s : row_shape_) {
    start.push_back(0);
    cnt.push_back(s);
  }
  Handle file_space(check(H5Dget_space(dset_.id()), "H5Dget_space"), H5Sclose);
  check_status(H5Sselect_hyperslab(file_space.id(), H5S_SELECT_SET, start.data(), nullptr, cnt.data(), nullptr),
               "H5Sselect_hyperslab");
  Handle mem_space(check(H5Screate_simple(static_cast<int>(cnt.size()), cnt.data(), nullptr), "H5Screate"), H5Sclose);
  check_status(H5Dread(dset_.id(), native_type<T>(), mem_space.id(), file_space.id(), H5P_DEFAULT, out.data()),
               ("H5Dread " + name_).c_str());
  return out;
}

template <class T>
CsrDataset<T> CsrDataset<T>::create(const File& file, hid_t loc, const std::string& name, hsize_t chunk_values) {
  CsrDataset d;
  d.group_ = create_group(loc, name);
  write_attr(d.group_.id(), "layout", std::string("csr: row i = values[offsets[i]:offsets[i+1]]"));
  d.values_ = AppendableDataset<T>::create(file, d.group_.id(), "values", {}, chunk_values);
  d.offsets_ = AppendableDataset<int64_t>::create(file, d.group_.id(), "offsets", {}, 4096);
  int rank = 0;
  if (file.parallel()) MPI_Comm_rank(file.comm(), &rank);
  const int64_t zero = 0;
  d.offsets_.append(&zero, rank == 0 ? 1 : 0);
  return d;
}

template <class T>
CsrDataset<T> CsrDataset<T>::open(const File& file, hid_t loc, const std::string& name) {
  CsrDataset d;
  d.group_ = open_group(loc, name);
  d.values_ = AppendableDataset<T>::open(file, d.group_.id(), "values");
  d.offsets_ = AppendableDataset<int64_t>::open(file, d.group_.id(), "offsets");
  SLIMPI_CHECK(d.offsets_.n_rows() >= 1, "CSR group '{}' has an empty offsets dataset", name);
  return d;
}

template <class T>
uint64_t CsrDataset<T>::append(const T* values, const int64_t* lengths, uint64_t n_local_rows) {
  const uint64_t n_values = std::accumulate(lengths, lengths + n_local_rows, uint64_t(0));
  const std::vector<AppendPlan> plan = plan_appends(offsets_.comm(), {{n_local_rows}, {n_values}});
  const uint64_t first_row = n_rows() + plan[0].first.front();
  append(values, lengths, plan[0], plan[1]);
  return first_row;
}

template <class T>
void CsrDataset<T>::append(const T* values, const int64_t* lengths, const AppendPlan& rows,
                           const AppendPlan& values_plan) {
  const uint64_t value_end = values_.n_rows();
  values_.append(values, values_plan);
  std::vector<int64_t> ends;  // [rows.local()] exclusive end of each row
  uint64_t r = 0;
  for (size_t p = 0; p < rows.count.size(); ++p) {
    int64_t end = static_cast<int64_t>(value_end + values_plan.first[p]);
    for (uint64_t k = 0; k < rows.count[p]; ++k, ++r) ends.push_back(end += lengths[r]);
  }
  offsets_.append(ends.data(), rows);
}

template <class T>
void CsrDataset<T>::truncate_to(uint64_t n_rows) {
  const int64_t end = offsets_.read(n_rows, 1).front();
  values_.truncate_to(static_cast<uint64_t>(end));
  offsets_.truncate_to(n_rows + 1);
}

template <class T>
std::vector<T> CsrDataset<T>::read_row(uint64_t row) const {
  std::vector<int64_t> bounds = offsets_.read(row, 2);
  return values_.read(bounds[0], bounds[1] - bounds[0]);
}

#define SLIMPI_INSTANTIATE(T)          \
  template class AppendableDataset<T>; \
  template class CsrDataset<T>;
SLIMPI_INSTANTIATE(float)
SLIMPI_INSTANTIATE(double)
SLIMPI_INSTANTIATE(int8_t)
SLIMPI_INSTANTIATE(uint8_t)
SLIMPI_INSTANTIATE(int16_t)
SLIMPI_INSTANTIATE(int32_t)
SLIMPI_INSTANTIATE(int64_t)
#undef SLIMPI_INSTANTIATE

}  // namespace slimpi::h5
