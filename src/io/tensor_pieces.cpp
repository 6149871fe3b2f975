#include "io/tensor_pieces.h"

#include <ATen/ATen.h>
#include <slimpi/error.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <exception>
#include <map>
#include <sstream>

#include "io/tensor_io.h"
#include "parallel/mpi_bytes.h"
#include "parallel/watchdog.h"

namespace slimpi {

TensorPiece whole_piece(const std::string& name, const at::Tensor& t) {
  return {name, t.sizes().vec(), 0, t.detach().reshape({-1}).cpu().contiguous()};
}

namespace {

struct Declared {
  std::string dtype;           // the stored dtype's name
  std::vector<int64_t> shape;  // whole
};

std::string shape_text(const std::vector<int64_t>& shape) { return fmt::format("{}", fmt::join(shape, "x")); }

// "name \t dtype \t d0,d1 \n" per tensor.
std::string encode(const std::map<std::string, Declared>& tensors) {
  std::string out;
  for (const auto& [name, d] : tensors) out += fmt::format("{}\t{}\t{}\n", name, d.dtype, fmt::join(d.shape, ","));
  return out;
}

void merge_into(std::map<std::string, Declared>& all, const std::string& text, const std::string& where) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t a = line.find('\t'), b = line.find('\t', a + 1);
    SLIMPI_CHECK(a != std::string::npos && b != std::string::npos, "{}: a malformed tensor declaration", where);
    Declared d{line.substr(a + 1, b - a - 1), {}};
    std::istringstream dims(line.substr(b + 1));
    for (std::string x; std::getline(dims, x, ',');) d.shape.push_back(std::stoll(x));
    const std::string name = line.substr(0, a);
    auto [it, fresh] = all.emplace(name, d);
    SLIMPI_CHECK(fresh || (it->second.dtype == d.dtype && it->second.shape == d.shape),
                 "{}: ranks disagree on tensor {}: {} {} and {} {}", where, name, shape_text(it->second.shape),
                 it->second.dtype, shape_text(d.shape), d.dtype);
  }
}

// Every rank's declarations, the same map on every rank of `comm`.
std::map<std::string, Declared> declared_everywhere(const std::map<std::string, Declared>& mine, MPI_Comm comm,
                                                    const std::string& where) {
  if (comm == MPI_COMM_NULL) return mine;
  const std::string text = encode(mine);
  int size = 1;
  MPI_Comm_size(comm, &size);
  std::vector<int> lengths(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  std::string all;
  {
    WaitGuard guard({&where, "tensor declarations (allgather)"});
    const int n = int(text.size());
    check_mpi(MPI_Allgather(&n, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm), "MPI_Allgather");
    int64_t total = 0;
    for (int r = 0; r < size; ++r) {
      offsets[size_t(r)] = int(total);
      total += lengths[size_t(r)];
    }
    SLIMPI_CHECK(total < (int64_t(1) << 31), "{}: {} bytes of tensor declarations", where, total);
    all.resize(size_t(total));
    check_mpi(MPI_Allgatherv(text.data(), n, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, comm),
              "MPI_Allgatherv");
  }
  std::map<std::string, Declared> merged;
  for (int r = 0; r < size; ++r)
    merge_into(merged, all.substr(size_t(offsets[size_t(r)]), size_t(lengths[size_t(r)])), where);
  return merged;
}

// The file space of `dataset` (of rank `nd`) with one block of a span selected.
h5::Handle select_block(hid_t dataset, size_t nd, const StoredWhole::Span::Block& b) {
  h5::Handle space(h5::check(H5Dget_space(dataset), "H5Dget_space"), H5Sclose);
  if (nd == 0) return space;  // one element: the whole (scalar) space
  const hsize_t start[2] = {hsize_t(b.row), hsize_t(b.col)}, count[2] = {hsize_t(b.rows), hsize_t(b.cols)};
  h5::check_status(H5Sselect_hyperslab(space.id(), H5S_SELECT_SET, start, nullptr, count, nullptr),
                   "H5Sselect_hyperslab");
  return space;
}

h5::Handle memory_space(int64_t n) {
  const hsize_t dims[1] = {hsize_t(n)};
  return h5::Handle(h5::check(H5Screate_simple(1, dims, nullptr), "H5Screate_simple"), H5Sclose);
}

// Moves the stored elements of `span` between the dataset and `data` (the piece's
// elements in order, of `element` bytes each).
void transfer(hid_t dataset, hid_t type, size_t nd, const StoredWhole::Span& span, char* data, size_t element,
              bool write, const std::string& name) {
  int64_t at = 0;
  for (const auto& b : span.blocks) {
    const int64_t n = b.rows * b.cols;
    h5::Handle file_space = select_block(dataset, nd, b), mem = memory_space(n);
    char* p = data + size_t(at) * element;
    const herr_t status = write ? H5Dwrite(dataset, type, mem.id(), file_space.id(), H5P_DEFAULT, p)
                                : H5Dread(dataset, type, mem.id(), file_space.id(), H5P_DEFAULT, p);
    h5::check_status(status, ((write ? "write part of tensor " : "read part of tensor ") + name).c_str());
    at += n;
  }
}

// Whether every element of a 1-D tensor is finite, looked at 2^20 elements at a time:
// at::isfinite over a whole 600 MB embedding makes about 1 GB of temporaries (|x| and
// three masks), which the process heap then keeps (main.cpp's allocator settings).
bool all_finite(const at::Tensor& flat) {
  constexpr int64_t chunk = int64_t(1) << 20;
  const int64_t n = flat.numel();
  for (int64_t from = 0; from < n; from += chunk)
    if (!at::isfinite(flat.slice(0, from, std::min(n, from + chunk))).all().item<bool>()) return false;
  return true;
}

}  // namespace

void write_tensor_pieces(const h5::File& file, hid_t loc, const StoredWhole& stored,
                         const std::vector<NamedTensor>& declared, const std::vector<TensorPiece>& pieces) {
  const std::string where = "writing " + file.path();
  std::map<std::string, Declared> mine;
  for (const auto& t : declared)
    merge_into(mine, encode({{t.name, {stored_dtype(t.tensor.scalar_type()).name,
                                        stored.whole_shape(t.name, t.tensor.sizes().vec())}}}), where);
  const std::map<std::string, Declared> all = declared_everywhere(mine, file.comm(), where);
  // Collective: every dataset created in the same order on every rank.
  std::map<std::string, h5::Handle> datasets;
  for (const auto& [name, d] : all) {
    at::ScalarType dtype = at::kFloat;
    for (const auto& st : stored_dtypes())
      if (d.dtype == st.name) dtype = st.torch;
    datasets.emplace(name, create_tensor_dataset(loc, name, d.shape, dtype, /*filled=*/false));
  }
  std::exception_ptr error;
  try {
    for (const auto& p : pieces) {
      auto it = datasets.find(p.name);
      SLIMPI_CHECK(it != datasets.end(), "{}: a piece of tensor {}, which no rank declared", where, p.name);
      SLIMPI_CHECK(p.values.is_contiguous() && p.values.dim() == 1 && !p.values.is_cuda(),
                   "{}: the piece of {} is not a contiguous 1-D CPU tensor", where, p.name);
      // A checkpoint is never written with non-finite numbers in it.
      SLIMPI_CHECK(!at::isFloatingType(p.values.scalar_type()) || all_finite(p.values),
                   "refusing to write {}: tensor {} holds NaN or inf values", file.path(), p.name);
      const StoredWhole::Span span = stored.span_of(p.name, p.local_shape, p.begin, p.values.numel());
      SLIMPI_CHECK(span.whole == all.at(p.name).shape && stored_dtype(p.values.scalar_type()).name == all.at(p.name).dtype,
                   "{}: the piece of {} is of a {} {} tensor, declared {} {}", where, p.name, shape_text(span.whole),
                   stored_dtype(p.values.scalar_type()).name, shape_text(all.at(p.name).shape), all.at(p.name).dtype);
      transfer(it->second.id(), stored_dtype(p.values.scalar_type()).h5, span.whole.size(), span,
               static_cast<char*>(p.values.data_ptr()), p.values.element_size(), /*write=*/true, p.name);
    }
  } catch (...) {
    error = std::current_exception();
  }
  datasets.clear();  // closed in name order on every rank
  if (error) std::rethrow_exception(error);
}

void read_tensor_pieces(hid_t loc, const StoredWhole& stored, std::vector<TensorPiece>& pieces, bool any_float) {
  // Every piece is checked before any is read, so a mismatch leaves the targets as they were.
  struct Opened {
    h5::Handle dataset;
    StoredTensorInfo info;
    StoredWhole::Span span;
  };
  std::vector<Opened> opened;
  for (const auto& p : pieces) {
    h5::Handle d(h5::check(H5Dopen2(loc, p.name.c_str(), H5P_DEFAULT), ("open tensor " + p.name).c_str()), H5Dclose);
    StoredTensorInfo info = stored_tensor_info(d.id(), p.name);
    StoredWhole::Span span = stored.span_of(p.name, p.local_shape, p.begin, p.values.numel());
    const at::ScalarType want = p.values.scalar_type();
    const bool same_kind = any_float && at::isFloatingType(info.dtype->torch) && at::isFloatingType(want);
    SLIMPI_CHECK(info.shape == span.whole && (info.dtype->torch == want || same_kind),
                 "stored tensor {} is {} {}, expected {} {}", p.name, shape_text(info.shape), info.dtype->name,
                 shape_text(span.whole), std::string(c10::toString(want)));
    opened.push_back({std::move(d), std::move(info), std::move(span)});
  }
  // One piece at a time, straight into its tensor where that is a CPU tensor of the
  // stored dtype; otherwise through a buffer of that piece alone.
  for (size_t i = 0; i < pieces.size(); ++i) {
    TensorPiece& p = pieces[i];
    const Opened& o = opened[i];
    const bool direct = !p.values.is_cuda() && p.values.is_contiguous() && p.values.scalar_type() == o.info.dtype->torch;
    at::Tensor values = direct ? p.values : at::empty({p.values.numel()}, o.info.dtype->torch);
    if (o.span.stored < values.numel()) values.zero_();  // the padded vocabulary elements are zero
    transfer(o.dataset.id(), o.info.dtype->h5, o.info.shape.size(), o.span, static_cast<char*>(values.data_ptr()),
             values.element_size(), /*write=*/false, p.name);
    if (!direct) p.values.copy_(values);
  }
}

}  // namespace slimpi
