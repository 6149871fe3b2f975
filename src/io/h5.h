// Thin RAII layer over the HDF5 C API. Role: every HDF5 call slimpi makes goes through
// here, is checked, and on failure throws slimpi::Error carrying HDF5's own error
// stack text. Handles close themselves; they are movable, not copyable.
//
// Files are parallel (MPI-IO, opened collectively over a communicator) or serial
// (MPI_COMM_NULL). In a parallel file every structural call (create, set_extent,
// attribute write) is collective over the file's communicator; data writes are
// collective too (ranks with nothing to write still take part).
#pragma once

#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace slimpi::h5 {

// Whether an H5Fclose failed in this process. HDF5 1.10 then keeps a half-closed file
// in its tables and crashes (SIGSEGV) closing it again when MPI_Finalize ends the
// library, so main() skips MPI_Finalize after an error when this is true.
bool library_damaged();
const std::string& library_damage_report();  // the failed close's message
// Throws that message when a close failed: for writers whose file is closed by a
// destructor (which cannot throw), before they call the file complete.
void check_no_failed_close();

// Throws slimpi::Error("<what>: <HDF5 error stack>").
[[noreturn]] void fail(const std::string& what);
inline hid_t check(hid_t id, const char* what) {
  if (id < 0) fail(what);
  return id;
}
inline herr_t check_status(herr_t status, const char* what) {
  if (status < 0) fail(what);
  return status;
}

// An owned hid_t with its close function.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t id() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }
  void release() { id_ = -1; }  // forget the id without closing it

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

// Native HDF5 type for a C++ element type.
template <class T>
hid_t native_type();

class File {
 public:
  File() = default;
  File(File&& o) noexcept = default;
  File& operator=(File&& o) noexcept;
  ~File() {
    try {
      close();
    } catch (...) {  // a destructor cannot report it: writers call close() themselves
    }
  }
  // Creates (truncating) `path`. comm = MPI_COMM_NULL: serial file of this process.
  static File create(const std::string& path, MPI_Comm comm);
  // Opens an existing file, read-only unless `writable`.
  static File open(const std::string& path, bool writable, MPI_Comm comm);

  hid_t id() const { return handle_.id(); }
  MPI_Comm comm() const { return comm_; }
  bool parallel() const { return comm_ != MPI_COMM_NULL; }
  const std::string& path() const { return path_; }
  void flush();
  // Closes the file (collective in a parallel file, under the watchdog); idempotent.
  // Throws when the close fails: its last writes did not reach the file (a full disk),
  // so a writer closes explicitly before it calls the file complete.
  void close();

 private:
  Handle handle_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string path_;
};

Handle create_group(hid_t loc, const std::string& name);
Handle open_group(hid_t loc, const std::string& name);
bool exists(hid_t loc, const std::string& name);

// Attributes (scalars and strings) on any object. Collective in a parallel file.
void write_attr(hid_t loc, const std::string& name, const std::string& value);
void write_attr(hid_t loc, const std::string& name, double value);
void write_attr(hid_t loc, const std::string& name, int64_t value);
bool has_attr(hid_t loc, const std::string& name);
std::string read_attr_string(hid_t loc, const std::string& name);
double read_attr_double(hid_t loc, const std::string& name);
int64_t read_attr_int(hid_t loc, const std::string& name);

// Data transfer list: collective MPI-IO for a parallel file, default otherwise.
Handle transfer_list(const File& file);

}  // namespace slimpi::h5
