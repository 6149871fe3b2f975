// ByteWriter / ByteReader — flat binary messages of PODs and vectors of PODs, for
// MPI point-to-point traffic between ranks of the same binary (same endianness and
// layout). A reader that runs past the end throws instead of reading garbage.
#pragma once

#include <slimpi/error.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace slimpi {

class ByteWriter {
 public:
  template <class T>
  void put(const T& v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  template <class T>
  void put_vector(const std::vector<T>& v) {
    put<uint64_t>(v.size());
    bytes_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    bytes_.append(s);
  }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

class ByteReader {
 public:
  explicit ByteReader(const std::string& b) : bytes_(b) {}
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  template <class T>
  std::vector<T> get_vector() {
    const uint64_t n = get<uint64_t>();
    need(n * sizeof(T));
    std::vector<T> v(n);
    std::memcpy(v.data(), bytes_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return v;
  }
  std::string get_string() {
    const uint64_t n = get<uint64_t>();
    need(n);
    std::string s = bytes_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  bool done() const { return pos_ == bytes_.size(); }

 private:
  void need(uint64_t n) const {
    SLIMPI_CHECK(pos_ + n <= bytes_.size(), "truncated message: {} bytes needed at {} of {}", n, pos_, bytes_.size());
  }
  const std::string& bytes_;
  size_t pos_ = 0;
};

}  // namespace slimpi
