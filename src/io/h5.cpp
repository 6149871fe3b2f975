#include "io/h5.h"

#include <slimpi/error.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <set>

#include "core/file_write.h"
#include "parallel/watchdog.h"

namespace slimpi::h5 {
namespace {

herr_t collect_frame(unsigned n, const H5E_error2_t* err, void* data) {
  auto* text = static_cast<std::string*>(data);
  if (n > 0) *text += " <- ";
  *text += fmt::format("{} ({})", err->desc ? err->desc : "?", err->func_name ? err->func_name : "?");
  return 0;
}

// HDF5 prints its error stack to stderr by default; slimpi reports it in exceptions.
void silence_auto_printing() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

Handle file_access(MPI_Comm comm) {
  Handle fapl(check(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate(fapl)"), H5Pclose);
  if (comm != MPI_COMM_NULL) {
    check_status(H5Pset_fapl_mpio(fapl.id(), comm, MPI_INFO_NULL), "H5Pset_fapl_mpio");
    check_status(H5Pset_all_coll_metadata_ops(fapl.id(), true), "H5Pset_all_coll_metadata_ops");
    check_status(H5Pset_coll_metadata_write(fapl.id(), true), "H5Pset_coll_metadata_write");
  }
  return fapl;
}

Handle string_type(size_t n) {
  Handle type(check(H5Tcopy(H5T_C_S1), "H5Tcopy"), H5Tclose);
  check_status(H5Tset_size(type.id(), n == 0 ? 1 : n), "H5Tset_size");
  check_status(H5Tset_strpad(type.id(), H5T_STR_NULLPAD), "H5Tset_strpad");
  return type;
}

template <class T>
void write_scalar_attr(hid_t loc, const std::string& name, T value) {
  if (has_attr(loc, name)) check_status(H5Adelete(loc, name.c_str()), "H5Adelete");
  Handle space(check(H5Screate(H5S_SCALAR), "H5Screate"), H5Sclose);
  Handle attr(check(H5Acreate2(loc, name.c_str(), native_type<T>(), space.id(), H5P_DEFAULT, H5P_DEFAULT),
                    ("H5Acreate " + name).c_str()),
              H5Aclose);
  check_status(H5Awrite(attr.id(), native_type<T>(), &value), "H5Awrite");
}

template <class T>
T read_scalar_attr(hid_t loc, const std::string& name) {
  Handle attr(check(H5Aopen(loc, name.c_str(), H5P_DEFAULT), ("H5Aopen " + name).c_str()), H5Aclose);
  T value{};
  check_status(H5Aread(attr.id(), native_type<T>(), &value), "H5Aread");
  return value;
}

bool damaged = false;       // an H5Fclose failed in this process
std::string damage_report;  // its error, for a close no caller could report (a destructor)

// Paths of the files this process has open: an HDF5 error says when one of them sits
// on a file system that is out of space (MPI-IO does not pass errno up).
std::mutex open_files_mutex;
std::multiset<std::string> open_files;

void note_open(const std::string& path) {
  std::lock_guard<std::mutex> lock(open_files_mutex);
  open_files.insert(path);
}

void note_closed(const std::string& path) {
  std::lock_guard<std::mutex> lock(open_files_mutex);
  auto it = open_files.find(path);
  if (it != open_files.end()) open_files.erase(it);
}

// One line per full file system among those of the open files.
std::string full_disk_note() {
  std::set<std::string> paths;
  {
    std::lock_guard<std::mutex> lock(open_files_mutex);
    paths.insert(open_files.begin(), open_files.end());
  }
  std::string note;
  std::set<dev_t> devices;
  for (const auto& p : paths) {
    struct stat st;
    if (stat(p.c_str(), &st) != 0 || !devices.insert(st.st_dev).second) continue;
    const std::string dir = std::filesystem::path(p).parent_path().string();
    if (auto full = disk_space_problem(dir.empty() ? p : dir)) note += (note.empty() ? "" : "; ") + *full;
  }
  return note;
}

}  // namespace

bool library_damaged() { return damaged; }
const std::string& library_damage_report() { return damage_report; }
void check_no_failed_close() {
  if (damaged) SLIMPI_FAIL("{}", damage_report);
}

void fail(const std::string& what) {
  std::string stack;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_frame, &stack);
  H5Eclear2(H5E_DEFAULT);
  // Out of space: that is the whole story (HDF5's chain is a dozen frames of it).
  if (const std::string full = full_disk_note(); !full.empty()) SLIMPI_FAIL("HDF5: {} failed: {}", what, full);
  std::replace(stack.begin(), stack.end(), '\n', ' ');
  SLIMPI_FAIL("HDF5: {} failed{}{}", what, stack.empty() ? "" : ": ", stack);
}

template <> hid_t native_type<float>() { return H5T_NATIVE_FLOAT; }
template <> hid_t native_type<double>() { return H5T_NATIVE_DOUBLE; }
template <> hid_t native_type<int8_t>() { return H5T_NATIVE_INT8; }
template <> hid_t native_type<uint8_t>() { return H5T_NATIVE_UINT8; }
template <> hid_t native_type<int16_t>() { return H5T_NATIVE_INT16; }
template <> hid_t native_type<int32_t>() { return H5T_NATIVE_INT32; }
template <> hid_t native_type<int64_t>() { return H5T_NATIVE_INT64; }
template <> hid_t native_type<uint64_t>() { return H5T_NATIVE_UINT64; }

File File::create(const std::string& path, MPI_Comm comm) {
  silence_auto_printing();
  File f;
  f.comm_ = comm;
  f.path_ = path;
  Handle fapl = file_access(comm);
  static const std::string context = "[HDF5 file]";
  WaitGuard guard({&context, comm == MPI_COMM_NULL ? "create (serial)" : "collective create", 0, "", -1, &f.path_});
  f.handle_ = Handle(check(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id()),
                           ("create file " + path).c_str()),
                     H5Fclose);
  note_open(path);
  return f;
}

File File::open(const std::string& path, bool writable, MPI_Comm comm) {
  silence_auto_printing();
  File f;
  f.comm_ = comm;
  f.path_ = path;
  Handle fapl = file_access(comm);
  static const std::string context = "[HDF5 file]";
  WaitGuard guard({&context, comm == MPI_COMM_NULL ? "open (serial)" : "collective open", 0, "", -1, &f.path_});
  f.handle_ = Handle(check(H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl.id()),
                           ("open file " + path).c_str()),
                     H5Fclose);
  note_open(path);
  return f;
}

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    try {
      close();
    } catch (...) {  // recorded: library_damage_report()
    }
    handle_ = std::move(o.handle_);
    comm_ = o.comm_;
    path_ = std::move(o.path_);
  }
  return *this;
}

void File::close() {
  if (!handle_.valid()) return;
  const std::string context = "[HDF5 file " + path_ + "]";
  WaitGuard guard({&context, parallel() ? "collective close" : "close", 0, "", -1, &path_});
  const hid_t id = handle_.id();
  handle_.release();
  if (H5Fclose(id) < 0) {
    // The data did not all reach the file (a full disk). HDF5 keeps the broken file in
    // its tables and crashes closing it again at exit: see library_damaged().
    damaged = true;
    try {
      fail("close of " + path_ + " (its last writes)");
    } catch (const Error& e) {
      note_closed(path_);
      damage_report = e.what();
      throw;
    }
  }
  note_closed(path_);
}

void File::flush() {
  const std::string context = "[HDF5 file " + path_ + "]";
  WaitGuard guard({&context, parallel() ? "collective flush" : "flush", 0, "", -1, &path_});
  check_status(H5Fflush(id(), H5F_SCOPE_GLOBAL), ("H5Fflush of " + path_).c_str());
}

Handle create_group(hid_t loc, const std::string& name) {
  return Handle(check(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      ("create group " + name).c_str()),
                H5Gclose);
}

Handle open_group(hid_t loc, const std::string& name) {
  return Handle(check(H5Gopen2(loc, name.c_str(), H5P_DEFAULT), ("open group " + name).c_str()), H5Gclose);
}

bool exists(hid_t loc, const std::string& name) {
  htri_t r = H5Lexists(loc, name.c_str(), H5P_DEFAULT);
  if (r < 0) fail("H5Lexists " + name);
  return r > 0;
}

void write_attr(hid_t loc, const std::string& name, const std::string& value) {
  if (has_attr(loc, name)) check_status(H5Adelete(loc, name.c_str()), "H5Adelete");
  Handle type = string_type(value.size());
  Handle space(check(H5Screate(H5S_SCALAR), "H5Screate"), H5Sclose);
  Handle attr(check(H5Acreate2(loc, name.c_str(), type.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT),
                    ("H5Acreate " + name).c_str()),
              H5Aclose);
  check_status(H5Awrite(attr.id(), type.id(), value.empty() ? "" : value.data()), "H5Awrite");
}
void write_attr(hid_t loc, const std::string& name, double value) { write_scalar_attr(loc, name, value); }
void write_attr(hid_t loc, const std::string& name, int64_t value) { write_scalar_attr(loc, name, value); }

bool has_attr(hid_t loc, const std::string& name) {
  htri_t r = H5Aexists(loc, name.c_str());
  if (r < 0) fail("H5Aexists " + name);
  return r > 0;
}

std::string read_attr_string(hid_t loc, const std::string& name) {
  Handle attr(check(H5Aopen(loc, name.c_str(), H5P_DEFAULT), ("H5Aopen " + name).c_str()), H5Aclose);
  Handle type(check(H5Aget_type(attr.id()), "H5Aget_type"), H5Tclose);
  SLIMPI_CHECK(H5Tget_class(type.id()) == H5T_STRING, "HDF5 attribute '{}' is not a string", name);
  {
    Handle space(check(H5Aget_space(attr.id()), "H5Aget_space"), H5Sclose);
    SLIMPI_CHECK(H5Sget_simple_extent_npoints(space.id()) == 1, "HDF5 attribute '{}' holds {} strings, not one", name,
                 H5Sget_simple_extent_npoints(space.id()));
  }
  if (H5Tis_variable_str(type.id()) > 0) {  // as h5py writes a str: read into HDF5's own buffer, then free it
    Handle mem(check(H5Tcopy(H5T_C_S1), "H5Tcopy"), H5Tclose);
    check_status(H5Tset_size(mem.id(), H5T_VARIABLE), "H5Tset_size");
    check_status(H5Tset_cset(mem.id(), H5Tget_cset(type.id())), "H5Tset_cset");
    char* text = nullptr;
    check_status(H5Aread(attr.id(), mem.id(), &text), ("H5Aread " + name).c_str());
    std::string value = text ? text : "";
    H5free_memory(text);
    return value;
  }
  size_t n = H5Tget_size(type.id());
  std::string value(n, '\0');
  Handle mem = string_type(n);
  check_status(H5Aread(attr.id(), mem.id(), value.data()), "H5Aread");
  value.erase(value.find_last_not_of('\0') + 1);
  return value;
}
double read_attr_double(hid_t loc, const std::string& name) { return read_scalar_attr<double>(loc, name); }
int64_t read_attr_int(hid_t loc, const std::string& name) { return read_scalar_attr<int64_t>(loc, name); }

Handle transfer_list(const File& file) {
  Handle dxpl(check(H5Pcreate(H5P_DATASET_XFER), "H5Pcreate(dxpl)"), H5Pclose);
  if (file.parallel()) check_status(H5Pset_dxpl_mpio(dxpl.id(), H5FD_MPIO_COLLECTIVE), "H5Pset_dxpl_mpio");
  return dxpl;
}

}  // namespace slimpi::h5
