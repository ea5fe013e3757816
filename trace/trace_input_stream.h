// The bytes of a trace: a file descriptor or a std::istream, decompressed as it is read when it
// begins with the gzip or zstd magic number (zstd only when built with libzstd), whatever its
// name. Only the trace reader uses it (trace_reader.cpp).
#pragma once

#include <zlib.h>
#if CUPOOL_HAVE_ZSTD
#include <zstd.h>
#endif

#include <cstddef>
#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace cupool {

// Streaming: a fixed input buffer, and the output goes straight into the reader's line buffer.
class TraceInputStream {
 public:
  // `fd` is closed at the end when `owned`. `name` names the input in errors.
  TraceInputStream(int fd, bool owned, std::string name) : fd_(fd), owned_(owned), name_(std::move(name)) {}
  TraceInputStream(std::istream& in, std::string name) : in_(&in), name_(std::move(name)) {}
  ~TraceInputStream();
  TraceInputStream(const TraceInputStream&) = delete;
  TraceInputStream& operator=(const TraceInputStream&) = delete;

  // Up to n bytes of the trace's text; 0 only at its end. Throws TraceError.
  std::size_t read(char* out, std::size_t n);
  // Bytes taken from the input so far (compressed bytes when it is compressed).
  std::uint64_t raw_bytes() const { return raw_bytes_; }
  // "gzip", "zstd", or "" for a plain trace.
  const char* compression() const { return kind_ == Kind::gzip ? "gzip" : kind_ == Kind::zstd ? "zstd" : ""; }

 private:
  static constexpr std::size_t kRawBuffer = 256 << 10;
  enum class Kind { unknown, plain, gzip, zstd };

  [[noreturn, gnu::cold]] void fail(const std::string& what) const;
  std::size_t read_raw(char* out, std::size_t n);
  bool refill();  // moves what is left of the input buffer to its front and reads more; false at the end
  void detect();
  std::size_t read_gzip(char* out, std::size_t n);
  std::size_t read_zstd(char* out, std::size_t n);

  int fd_ = -1;
  bool owned_ = false;
  std::istream* in_ = nullptr;
  std::string name_;
  Kind kind_ = Kind::unknown;
  std::vector<char> buf_;  // compressed input, and the first bytes of any input
  std::size_t pos_ = 0, end_ = 0;
  bool raw_eof_ = false;
  std::uint64_t raw_bytes_ = 0;
  z_stream z_{};
  bool member_done_ = false;
#if CUPOOL_HAVE_ZSTD
  ZSTD_DStream* zstd_ = nullptr;
  bool zstd_pending_ = false;
#endif
};

}  // namespace cupool
