// The bytes of a trace, decompressed as they are read (trace_input_stream.h): plain, gzip (zlib)
// or zstd (libzstd), told apart by their first bytes.
#include "trace_input_stream.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "trace_reader.h"  // TraceError

namespace cupool {

TraceInputStream::~TraceInputStream() {
  if (kind_ == Kind::gzip) inflateEnd(&z_);
#if CUPOOL_HAVE_ZSTD
  if (zstd_) ZSTD_freeDStream(zstd_);
#endif
  if (owned_) ::close(fd_);
}

std::size_t TraceInputStream::read(char* out, std::size_t n) {
  if (kind_ == Kind::unknown) detect();
  switch (kind_) {
    case Kind::gzip: return read_gzip(out, n);
    case Kind::zstd: return read_zstd(out, n);
    default: break;
  }
  if (pos_ < end_) {  // what detect() looked at
    const std::size_t k = std::min(n, end_ - pos_);
    std::memcpy(out, buf_.data() + pos_, k);
    pos_ += k;
    return k;
  }
  return raw_eof_ ? 0 : read_raw(out, n);
}

void TraceInputStream::fail(const std::string& what) const {
  throw TraceError(fmt::format("{}: {}", name_, what));
}

std::size_t TraceInputStream::read_raw(char* out, std::size_t n) {
  std::size_t got = 0;
  if (in_) {
    in_->read(out, static_cast<std::streamsize>(n));
    if (in_->bad()) fail("read error");
    got = static_cast<std::size_t>(in_->gcount());
  } else {
    ssize_t r;
    do {
      r = ::read(fd_, out, n);
    } while (r < 0 && errno == EINTR);
    if (r < 0) fail(fmt::format("read error: {}", std::strerror(errno)));
    got = static_cast<std::size_t>(r);
  }
  if (got == 0) raw_eof_ = true;
  raw_bytes_ += got;
  return got;
}

bool TraceInputStream::refill() {
  if (raw_eof_) return false;
  if (buf_.empty()) buf_.resize(kRawBuffer);
  if (pos_ > 0) {
    std::memmove(buf_.data(), buf_.data() + pos_, end_ - pos_);
    end_ -= pos_;
    pos_ = 0;
  }
  const std::size_t got = read_raw(buf_.data() + end_, buf_.size() - end_);
  end_ += got;
  return got > 0;
}

void TraceInputStream::detect() {
  while (end_ - pos_ < 4 && refill()) {
  }
  const auto* b = reinterpret_cast<const unsigned char*>(buf_.data() + pos_);
  const std::size_t have = end_ - pos_;
  kind_ = Kind::plain;
  if (have >= 2 && b[0] == 0x1f && b[1] == 0x8b) {
    z_ = z_stream{};
    if (inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK) fail("cannot start gzip decompression");
    kind_ = Kind::gzip;
  } else if (have >= 4 && b[0] == 0x28 && b[1] == 0xb5 && b[2] == 0x2f && b[3] == 0xfd) {
#if CUPOOL_HAVE_ZSTD
    zstd_ = ZSTD_createDStream();
    if (!zstd_ || ZSTD_isError(ZSTD_initDStream(zstd_))) fail("cannot start zstd decompression");
    kind_ = Kind::zstd;
#else
    fail("the trace is compressed with zstd, and this cupool was built without libzstd; decompress it first "
         "(zstd -d)");
#endif
  }
}

std::size_t TraceInputStream::read_gzip(char* out, std::size_t n) {
  for (;;) {
    if (pos_ == end_ && !refill()) {
      if (!member_done_) fail("the gzip data ends early (the file is cut short)");
      return 0;
    }
    if (member_done_) {  // another member follows (concatenated .gz files)
      inflateReset(&z_);
      member_done_ = false;
    }
    z_.next_in = reinterpret_cast<Bytef*>(buf_.data() + pos_);
    z_.avail_in = static_cast<uInt>(end_ - pos_);
    z_.next_out = reinterpret_cast<Bytef*>(out);
    z_.avail_out = static_cast<uInt>(std::min<std::size_t>(n, UINT32_MAX));
    const int rc = inflate(&z_, Z_NO_FLUSH);
    pos_ = end_ - z_.avail_in;
    const std::size_t produced = static_cast<std::size_t>(reinterpret_cast<char*>(z_.next_out) - out);
    if (rc == Z_STREAM_END) member_done_ = true;
    else if (rc != Z_OK && rc != Z_BUF_ERROR)
      fail(fmt::format("not valid gzip data ({})", z_.msg ? z_.msg : "inflate failed"));
    if (produced > 0) return produced;
  }
}

std::size_t TraceInputStream::read_zstd(char* out, std::size_t n) {
#if CUPOOL_HAVE_ZSTD
  for (;;) {
    if (pos_ == end_ && !refill()) {
      if (zstd_pending_) fail("the zstd data ends early (the file is cut short)");
      return 0;
    }
    ZSTD_inBuffer in{buf_.data() + pos_, end_ - pos_, 0};
    ZSTD_outBuffer o{out, n, 0};
    const std::size_t rc = ZSTD_decompressStream(zstd_, &o, &in);
    if (ZSTD_isError(rc)) fail(fmt::format("not valid zstd data ({})", ZSTD_getErrorName(rc)));
    pos_ += in.pos;
    zstd_pending_ = rc != 0;  // 0: a frame is complete
    if (o.pos > 0) return o.pos;
  }
#else
  (void)out;
  (void)n;
  return 0;
#endif
}

}  // namespace cupool
