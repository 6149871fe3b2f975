#include "io/inspect.h"

#include <slimpi/error.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "io/h5.h"

namespace slimpi {
namespace {

struct Visit {
  hid_t file;
  std::vector<std::string> lines;
};

std::string shape_text(hid_t dset, std::vector<hsize_t>& dims) {
  h5::Handle space(h5::check(H5Dget_space(dset), "H5Dget_space"), H5Sclose);
  dims.resize(H5Sget_simple_extent_ndims(space.id()));
  H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr);
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

std::string type_text(hid_t dset) {
  h5::Handle type(h5::check(H5Dget_type(dset), "H5Dget_type"), H5Tclose);
  size_t bits = H5Tget_size(type.id()) * 8;
  switch (H5Tget_class(type.id())) {
    case H5T_FLOAT: return fmt::format("float{}", bits);
    case H5T_INTEGER: return fmt::format("{}int{}", H5Tget_sign(type.id()) == H5T_SGN_NONE ? "u" : "", bits);
    case H5T_STRING: return "string";
    default: return "other";
  }
}

// min / mean / max of a numeric 1-D dataset, read as doubles (NaNs skipped).
std::string stats_text(hid_t dset, hsize_t n) {
  if (n == 0) return "empty";
  std::vector<double> v(n);
  if (H5Dread(dset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0) return "";
  double lo = std::numeric_limits<double>::infinity(), hi = -lo, sum = 0;
  size_t finite = 0;
  for (double x : v)
    if (!std::isnan(x)) {
      lo = std::min(lo, x);
      hi = std::max(hi, x);
      sum += x;
      ++finite;
    }
  if (finite == 0) return "all NaN";
  std::string s = fmt::format("min {:.6g}  mean {:.6g}  max {:.6g}", lo, sum / finite, hi);
  if (finite < n) s += fmt::format("  ({} NaN)", n - finite);
  return s;
}

// A CSR column (io/appendable_dataset.h): a group with `values` and 1-D `offsets`.
bool is_csr_group(hid_t group) {
  if (!h5::exists(group, "offsets") || !h5::exists(group, "values")) return false;
  h5::Handle off(h5::check(H5Dopen2(group, "offsets", H5P_DEFAULT), "H5Dopen offsets"), H5Dclose);
  h5::Handle space(h5::check(H5Dget_space(off.id()), "H5Dget_space"), H5Sclose);
  return H5Sget_simple_extent_ndims(space.id()) == 1;
}

herr_t visit_object(hid_t root, const char* name, const H5O_info_t* info, void* data) {
  auto* v = static_cast<Visit*>(data);
  std::string path = name;
  if (path == ".") return 0;
  size_t depth = std::count(path.begin(), path.end(), '/');
  std::string indent(2 * depth + 2, ' ');
  std::string leaf = path.substr(path.rfind('/') + 1);
  if (info->type == H5O_TYPE_GROUP) {
    h5::Handle g = h5::open_group(root, path);
    if (is_csr_group(g.id())) {
      h5::Handle off(h5::check(H5Dopen2(g.id(), "offsets", H5P_DEFAULT), "H5Dopen offsets"), H5Dclose);
      std::vector<hsize_t> dims;
      shape_text(off.id(), dims);
      std::vector<int64_t> o(dims[0]);
      h5::check_status(H5Dread(off.id(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, o.data()), "H5Dread offsets");
      int64_t longest = 0;
      for (size_t i = 1; i < o.size(); ++i) longest = std::max(longest, o[i] - o[i - 1]);
      size_t rows = o.empty() ? 0 : o.size() - 1;
      v->lines.push_back(fmt::format("{}{}/  csr: {} rows, {} values, row length mean {:.1f} max {}", indent, leaf,
                                     rows, o.empty() ? 0 : o.back(),
                                     rows ? double(o.back()) / rows : 0.0, longest));
    } else {
      v->lines.push_back(fmt::format("{}{}/", indent, leaf));
    }
    return 0;
  }
  if (info->type != H5O_TYPE_DATASET) return 0;
  std::string parent = path.find('/') == std::string::npos ? "" : path.substr(0, path.rfind('/'));
  if (leaf == "offsets" || leaf == "values") {
    if (!parent.empty()) {
      h5::Handle g = h5::open_group(root, parent);
      if (is_csr_group(g.id())) return 0;  // shown with its group
    }
  }
  h5::Handle d(h5::check(H5Dopen2(root, path.c_str(), H5P_DEFAULT), "H5Dopen"), H5Dclose);
  std::vector<hsize_t> dims;
  std::string shape = shape_text(d.id(), dims);
  std::string type = type_text(d.id());
  std::string stats = dims.size() == 1 && type != "string" && type != "other" ? stats_text(d.id(), dims[0]) : "";
  v->lines.push_back(fmt::format("{}{:<28} {:<8} {:<12} {}", indent, leaf, type, shape, stats));
  return 0;
}

}  // namespace

std::string inspect_h5(const std::string& path) {
  h5::File file = h5::File::open(path, /*writable=*/false, MPI_COMM_NULL);
  std::string out = fmt::format("{}\n", path);
  for (const char* attr : {"kind", "slimpi_version", "created_utc"})
    if (h5::has_attr(file.id(), attr)) out += fmt::format("  {}: {}\n", attr, h5::read_attr_string(file.id(), attr));
  if (h5::has_attr(file.id(), "deck")) {
    std::string deck = h5::read_attr_string(file.id(), "deck");
    out += fmt::format("  deck: {} lines (h5dump -a /deck {} shows it)\n",
                       std::count(deck.begin(), deck.end(), '\n'), path);
  }
  Visit v{file.id(), {}};
  h5::check_status(H5Ovisit(file.id(), H5_INDEX_NAME, H5_ITER_INC, visit_object, &v), "H5Ovisit");
  for (const auto& line : v.lines) out += line + "\n";
  return out;
}

}  // namespace slimpi
