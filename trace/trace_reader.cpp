#include "trace_reader.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#if CUPOOL_HAVE_ZSTD
#include <zstd.h>
#endif

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "options.h"

namespace cupool {
namespace {

namespace tk = trace::key;

constexpr std::size_t kInitialBuffer = 64 << 10;  // grows for longer lines
constexpr std::size_t kMaxLine = 64 << 20;  // a header with a huge command line still fits
constexpr int kMaxDepth = 64;                // nesting in skipped values

template <typename Enum, std::size_t N>
bool lookup_name(std::string_view name, const std::array<std::string_view, N>& names, Enum& out) {
  for (std::size_t i = 0; i < N; ++i)
    if (names[i].size() == name.size() && !name.empty() && names[i][0] == name[0] &&
        std::memcmp(names[i].data(), name.data(), name.size()) == 0) {
      out = static_cast<Enum>(i);
      return true;
    }
  return false;
}

// Event fields, as bits, to find the missing ones.
enum Field : std::uint32_t {
  f_t = 1u << 0, f_tid = 1u << 1, f_ev = 1u << 2, f_api = 1u << 3, f_path = 1u << 4, f_dev = 1u << 5,
  f_size = 1u << 6, f_ptr = 1u << 7, f_rc = 1u << 8, f_dur = 1u << 9,
};
// `dur` is required only of 1.x traces: from 2.0 on, calls that were not timed leave it out.
constexpr std::uint32_t kRequired = f_t | f_tid | f_ev | f_api | f_path | f_dev | f_size | f_ptr | f_rc;
constexpr std::pair<Field, std::string_view> kRequiredNames[] = {
    {f_t, tk::t},       {f_tid, tk::tid},   {f_ev, tk::ev},   {f_api, tk::api}, {f_path, tk::path},
    {f_dev, tk::dev},   {f_size, tk::size}, {f_ptr, tk::ptr}, {f_rc, tk::rc},   {f_dur, tk::dur}};

// Characters that end the plain run of a JSON string: the quote, an escape, a control character.
constexpr auto kStringStop = [] {
  std::array<bool, 256> stop{};
  for (int c = 0; c < 0x20; ++c) stop[static_cast<std::size_t>(c)] = true;
  stop['"'] = stop['\\'] = true;
  return stop;
}();

enum class Key : std::uint8_t {
  unknown, type, t, tid, ev, api, path, dev, size, ptr, stream, rc, dur, oom, reserved, in_use, largest_free,
  quarantined, free_blocks, flags, cached, timed_for, recycled, handle, offset, granules, stack
};

// The key names, checked against the schema so the two cannot drift apart.
static_assert(tk::t == "t" && tk::ev == "ev" && tk::rc == "rc" && tk::tid == "tid" && tk::api == "api" &&
              tk::ptr == "ptr" && tk::oom_class == "oom" && tk::dev == "dev" && tk::dur == "dur" &&
              tk::type == "type" && tk::path == "path" && tk::size == "size" && tk::stream == "stream" &&
              tk::in_use == "in_use" && tk::reserved == "reserved" && tk::free_blocks == "free_blocks" &&
              tk::quarantined == "quarantined" && tk::largest_free == "largest_free" && tk::flags == "flags" &&
              tk::cached == "cached" && tk::timed_for == "timed_for" && tk::recycled == "recycled" &&
              tk::handle == "handle" && tk::offset == "offset" && tk::granules == "granules" && tk::stack == "stack");

// One fixed-size comparison per key instead of a chain of them. k.size() is N - 1 here.
template <std::size_t N>
Key key_if(std::string_view k, const char (&name)[N], Key key) {
  return std::memcmp(k.data(), name, N - 1) == 0 ? key : Key::unknown;
}

Key key_of(std::string_view k) {
  switch (k.size()) {
    case 1: return k[0] == 't' ? Key::t : Key::unknown;
    case 2: return k[0] == 'e' ? key_if(k, "ev", Key::ev) : key_if(k, "rc", Key::rc);
    case 3:
      switch (k[0]) {
        case 't': return key_if(k, "tid", Key::tid);
        case 'a': return key_if(k, "api", Key::api);
        case 'p': return key_if(k, "ptr", Key::ptr);
        case 'o': return key_if(k, "oom", Key::oom);
        case 'd': return k[1] == 'e' ? key_if(k, "dev", Key::dev) : key_if(k, "dur", Key::dur);
      }
      return Key::unknown;
    case 4:
      switch (k[0]) {
        case 't': return key_if(k, "type", Key::type);
        case 'p': return key_if(k, "path", Key::path);
        case 's': return key_if(k, "size", Key::size);
      }
      return Key::unknown;
    case 5: return k[0] == 'f' ? key_if(k, "flags", Key::flags) : key_if(k, "stack", Key::stack);
    case 6:
      switch (k[0]) {
        case 's': return key_if(k, "stream", Key::stream);
        case 'i': return key_if(k, "in_use", Key::in_use);
        case 'c': return key_if(k, "cached", Key::cached);
        case 'h': return key_if(k, "handle", Key::handle);
        case 'o': return key_if(k, "offset", Key::offset);
      }
      return Key::unknown;
    case 8:
      if (k[0] == 'g') return key_if(k, "granules", Key::granules);
      return k[2] == 's' ? key_if(k, "reserved", Key::reserved) : key_if(k, "recycled", Key::recycled);
    case 9: return key_if(k, "timed_for", Key::timed_for);
    case 11: return k[0] == 'f' ? key_if(k, "free_blocks", Key::free_blocks) : key_if(k, "quarantined", Key::quarantined);
    case 12: return key_if(k, "largest_free", Key::largest_free);
  }
  return Key::unknown;
}

// A flat JSON object, scanned in place. Errors are returned as text; the reader adds the place.
class Scanner {
 public:
  Scanner(const char* p, const char* end) : p_(p), end_(end) {}

  std::string error;

  bool ok() const { return error.empty(); }
  void ws() {
    // The writer writes no whitespace: one comparison in the common case.
    if (p_ < end_ && static_cast<unsigned char>(*p_) > ' ') [[likely]]
      return;
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\r')) ++p_;
  }
  bool at_end() {
    ws();
    return p_ == end_;
  }
  bool eat(char c) {
    ws();
    if (p_ < end_ && *p_ == c) {
      ++p_;
      return true;
    }
    return false;
  }
  bool expect(char c, const char* what) {
    if (eat(c)) return true;
    return set_error(p_ < end_ ? fmt::format("expected {} at column {}", what, column())
                               : fmt::format("expected {}, the line ends", what));
  }
  bool set_error(std::string e) {
    if (error.empty()) error = std::move(e);
    return false;
  }
  std::size_t column() const { return static_cast<std::size_t>(p_ - start_) + 1; }
  void set_start(const char* s) { start_ = s; }

  // A string without escapes comes back as a view of the line; with escapes it is decoded into
  // `storage` and the view points there.
  bool string(std::string_view& out, std::string& storage) {
    ws();
    if (p_ >= end_ || *p_ != '"') return set_error(fmt::format("expected a string at column {}", column()));
    const char* s = ++p_;
    while (p_ < end_ && !kStringStop[static_cast<unsigned char>(*p_)]) ++p_;
    if (p_ < end_ && *p_ == '"') {
      out = std::string_view(s, static_cast<std::size_t>(p_ - s));
      ++p_;
      return true;
    }
    storage.assign(s, p_);
    while (p_ < end_) {
      const char c = *p_++;
      if (c == '"') {
        out = storage;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) return set_error("a control character inside a string");
      if (c != '\\') {
        storage += c;
        continue;
      }
      if (p_ >= end_) break;
      switch (const char e = *p_++) {
        case '"': storage += '"'; break;
        case '\\': storage += '\\'; break;
        case '/': storage += '/'; break;
        case 'b': storage += '\b'; break;
        case 'f': storage += '\f'; break;
        case 'n': storage += '\n'; break;
        case 'r': storage += '\r'; break;
        case 't': storage += '\t'; break;
        case 'u': {
          std::uint32_t cp;
          if (!hex4(cp)) return set_error("a bad \\u escape");
          if (cp >= 0xd800 && cp <= 0xdbff) {  // a surrogate pair
            std::uint32_t low;
            if (end_ - p_ < 6 || p_[0] != '\\' || p_[1] != 'u') return set_error("a lone surrogate in \\u escape");
            p_ += 2;
            if (!hex4(low) || low < 0xdc00 || low > 0xdfff) return set_error("a lone surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          } else if (cp >= 0xdc00 && cp <= 0xdfff) {
            return set_error("a lone surrogate in \\u escape");
          }
          append_utf8(storage, cp);
          break;
        }
        default:
          (void)e;
          return set_error("a bad escape in a string");
      }
    }
    return set_error("a string is not closed");
  }

  bool skip_string() {
    std::string_view ignored;
    return string(ignored, skip_storage_);
  }

  // A JSON number token (not checked beyond its characters).
  std::string_view number_token() {
    ws();
    const char* s = p_;
    while (p_ < end_ && ((*p_ >= '0' && *p_ <= '9') || *p_ == '-' || *p_ == '+' || *p_ == '.' || *p_ == 'e' ||
                         *p_ == 'E'))
      ++p_;
    return std::string_view(s, static_cast<std::size_t>(p_ - s));
  }

  // Integers by hand: this is most of the work of reading an event line.
  bool u64(std::uint64_t& out) {
    ws();
    const char* p = p_;
    const char* const end = end_;
    std::uint64_t v = 0;
    int digits = 0;
    while (p < end && static_cast<unsigned>(*p - '0') < 10) {
      const auto d = static_cast<unsigned>(*p - '0');
      if (digits >= 19) [[unlikely]] {  // only a 20th digit can overflow, and only past 18446744073709551615
        constexpr std::uint64_t kMaxDiv10 = UINT64_MAX / 10;
        if (digits > 19 || v > kMaxDiv10 || (v == kMaxDiv10 && d > UINT64_MAX % 10)) return false;
      }
      v = v * 10 + d;
      ++digits;
      ++p;
    }
    p_ = p;
    if (digits == 0) return false;
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) return false;  // not an integer
    out = v;
    return true;
  }
  bool i64(std::int64_t& out) {
    ws();
    const bool negative = p_ < end_ && *p_ == '-';
    if (negative) ++p_;
    if (p_ < end_ && *p_ == '-') return false;
    std::uint64_t v;
    if (!u64(v)) return false;
    if (v > static_cast<std::uint64_t>(INT64_MAX) + (negative ? 1 : 0)) return false;
    out = negative ? static_cast<std::int64_t>(0 - v) : static_cast<std::int64_t>(v);
    return true;
  }
  // "0x7f00" (as the writer writes addresses and handles), or a plain number.
  bool address(std::uint64_t& out) {
    ws();
    if (p_ < end_ && *p_ != '"') return u64(out);
    const char* at = p_;
    std::string_view s;
    if (raw_string(s) && parse_hex(s, out)) return true;
    rewind(at);  // escapes, or not an address: the careful way
    return string(s, skip_storage_) && parse_hex(s, out);
  }
  static bool parse_hex(std::string_view s, std::uint64_t& out) {
    if (s.size() < 3 || s.size() > 18 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X')) return false;
    const auto [q, ec] = std::from_chars(s.data() + 2, s.data() + s.size(), out, 16);
    return ec == std::errc() && q == s.data() + s.size();
  }

  const char* pos() const { return p_; }
  void rewind(const char* at) { p_ = at; }
  // The bytes up to the next quote, unchecked: callers take the result only when it matches
  // something known (which has no escapes), and otherwise rewind and call string().
  bool raw_string(std::string_view& out) {
    ws();
    if (p_ >= end_ || *p_ != '"') return false;
    const char* s = p_ + 1;
    const auto* q = static_cast<const char*>(std::memchr(s, '"', static_cast<std::size_t>(end_ - s)));
    if (q == nullptr) return false;
    out = std::string_view(s, static_cast<std::size_t>(q - s));
    p_ = q + 1;
    return true;
  }

  // Any JSON value; nested objects and arrays are checked for balance only.
  bool skip_value() {
    ws();
    if (p_ >= end_) return set_error("a value is missing, the line ends");
    const char c = *p_;
    if (c == '"') return skip_string();
    if (c == '{' || c == '[') {
      char stack[kMaxDepth];
      int depth = 0;
      while (p_ < end_) {
        const char d = *p_;
        if (d == '"') {
          if (!skip_string()) return false;
          continue;
        }
        ++p_;
        if (d == '{' || d == '[') {
          if (depth == kMaxDepth) return set_error("a value nested too deep");
          stack[depth++] = d == '{' ? '}' : ']';
        } else if (d == '}' || d == ']') {
          if (depth == 0 || stack[depth - 1] != d) return set_error("unbalanced brackets");
          if (--depth == 0) return true;
        }
      }
      return set_error("a value is not closed");
    }
    for (std::string_view lit : {"true", "false", "null"})
      if (static_cast<std::size_t>(end_ - p_) >= lit.size() && std::string_view(p_, lit.size()) == lit) {
        p_ += lit.size();
        return true;
      }
    const std::string_view tok = number_token();
    double ignored;
    const auto [q, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), ignored);
    if (tok.empty() || ec != std::errc() || q != tok.data() + tok.size())
      return set_error(fmt::format("not a JSON value at column {}", column()));
    return true;
  }

  bool boolean(bool& v) {
    for (const bool candidate : {true, false}) {
      const std::string_view lit = candidate ? "true" : "false";
      if (static_cast<std::size_t>(end_ - p_) >= lit.size() && std::string_view(p_, lit.size()) == lit) {
        p_ += lit.size();
        v = candidate;
        return true;
      }
    }
    return set_error(fmt::format("not true or false at column {}", column()));
  }

 private:
  bool hex4(std::uint32_t& cp) {
    if (end_ - p_ < 4) return false;
    const auto [q, ec] = std::from_chars(p_, p_ + 4, cp, 16);
    if (ec != std::errc() || q != p_ + 4) return false;
    p_ += 4;
    return true;
  }
  static void append_utf8(std::string& s, std::uint32_t cp) {
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xc0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xe0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      s += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      s += static_cast<char>(0xf0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      s += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  const char* p_;
  const char* end_;
  const char* start_ = nullptr;
  std::string skip_storage_;
};

// nlohmann accessors with messages in the reader's words.
struct JsonFields {
  const nlohmann::json& j;
  std::string_view what;  // "header", "footer", "device line"

  const nlohmann::json& need(const char* key) const {
    const auto it = j.find(key);
    if (it == j.end()) throw std::invalid_argument(fmt::format("{} has no \"{}\"", what, key));
    return *it;
  }
  std::uint64_t u64(const char* key) const {
    const auto& v = need(key);
    if (!v.is_number_unsigned()) throw std::invalid_argument(fmt::format("{} field \"{}\": expected a non-negative integer", what, key));
    return v.get<std::uint64_t>();
  }
  std::int64_t i64(const char* key) const {
    const auto& v = need(key);
    if (!v.is_number_integer()) throw std::invalid_argument(fmt::format("{} field \"{}\": expected an integer", what, key));
    return v.get<std::int64_t>();
  }
  int int_in(const char* key, std::int64_t lo, std::int64_t hi) const {
    const std::int64_t v = i64(key);
    if (v < lo || v > hi) throw std::invalid_argument(fmt::format("{} field \"{}\": {} is out of range", what, key, v));
    return static_cast<int>(v);
  }
  std::string str(const char* key) const {
    const auto& v = need(key);
    if (!v.is_string()) throw std::invalid_argument(fmt::format("{} field \"{}\": expected a string", what, key));
    return v.get<std::string>();
  }
};

DeviceInfo device_from(const nlohmann::json& j, std::string_view what) {
  if (!j.is_object()) throw std::invalid_argument(fmt::format("{}: expected an object", what));
  const JsonFields f{j, what};
  namespace dk = trace::device_key;
  return DeviceInfo{f.int_in(dk::index, 0, 1 << 20), f.str(dk::name), f.u64(dk::total_bytes)};
}

// The length of the well-formed UTF-8 sequence at p (1 to 4), or 0 if none begins there
// (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
std::size_t utf8_sequence(const unsigned char* p, const unsigned char* end) {
  const unsigned char c = *p;
  if (c < 0x80) return 1;
  const std::size_t n = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xc2 && c <= 0xdf ? 2 : 0;
  if (n == 0 || static_cast<std::size_t>(end - p) < n) return 0;
  for (std::size_t i = 1; i < n; ++i)
    if ((p[i] & 0xc0) != 0x80) return 0;
  if (n == 3) {
    const unsigned cp = ((c & 0x0fu) << 12) | ((p[1] & 0x3fu) << 6);
    if (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  }
  if (n == 4) {
    const unsigned cp = ((c & 0x07u) << 18) | ((p[1] & 0x3fu) << 12);
    if (cp < 0x10000 || cp > 0x10ffff) return 0;
  }
  return n;
}

// Almost every line is ASCII: eight bytes at a time.
bool is_ascii(std::string_view s) {
  const char* p = s.data();
  std::size_t n = s.size();
  std::uint64_t any = 0;
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    any |= w;
  }
  for (; n > 0; ++p, --n) any |= static_cast<unsigned char>(*p);
  return (any & 0x8080808080808080ull) == 0;
}

bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    const std::size_t n = utf8_sequence(p, end);
    if (n == 0) return false;
    p += n;
  }
  return true;
}

}  // namespace

std::string valid_utf8(std::string_view s) {
  if (is_ascii(s) || is_valid_utf8(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    const std::size_t n = utf8_sequence(p, end);
    if (n == 0) {
      out += "\xef\xbf\xbd";  // U+FFFD
      ++p;
      continue;
    }
    out.append(reinterpret_cast<const char*>(p), n);
    p += n;
  }
  return out;
}

// ---- the bytes of a trace ----------------------------------------------------------------------

// A descriptor or a std::istream, decompressed when it begins with the gzip or zstd magic number.
// Streaming: a fixed input buffer, and the output goes straight into the reader's line buffer.
class TraceInputStream {
 public:
  TraceInputStream(int fd, bool owned, std::string name) : fd_(fd), owned_(owned), name_(std::move(name)) {}
  TraceInputStream(std::istream& in, std::string name) : in_(&in), name_(std::move(name)) {}
  ~TraceInputStream() {
    if (kind_ == Kind::gzip) inflateEnd(&z_);
#if CUPOOL_HAVE_ZSTD
    if (zstd_) ZSTD_freeDStream(zstd_);
#endif
    if (owned_) ::close(fd_);
  }
  TraceInputStream(const TraceInputStream&) = delete;
  TraceInputStream& operator=(const TraceInputStream&) = delete;

  // Up to n bytes of the trace's text; 0 only at its end. Throws TraceError.
  std::size_t read(char* out, std::size_t n) {
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
  std::uint64_t raw_bytes() const { return raw_bytes_; }
  const char* compression() const {
    return kind_ == Kind::gzip ? "gzip" : kind_ == Kind::zstd ? "zstd" : "";
  }

 private:
  static constexpr std::size_t kRawBuffer = 256 << 10;
  enum class Kind { unknown, plain, gzip, zstd };

  [[noreturn, gnu::cold]] void fail(const std::string& what) const {
    throw TraceError(fmt::format("{}: {}", name_, what));
  }

  std::size_t read_raw(char* out, std::size_t n) {
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

  // Moves what is left of the input buffer to its front and reads more; false at the end.
  bool refill() {
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

  void detect() {
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

  std::size_t read_gzip(char* out, std::size_t n) {
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

  std::size_t read_zstd(char* out, std::size_t n) {
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

TraceReader::TraceReader(std::istream& in, std::string source_name)
    : TraceReader(std::make_unique<TraceInputStream>(in, valid_utf8(source_name)), source_name) {}

TraceReader::TraceReader(std::unique_ptr<TraceInputStream> in, std::string source_name)
    : in_(std::move(in)), source_(valid_utf8(source_name)), buf_(kInitialBuffer) {
  read_header();
}

TraceReader::~TraceReader() = default;

std::unique_ptr<TraceReader> TraceReader::open(const std::string& path) {
  if (path == "-") return std::unique_ptr<TraceReader>(new TraceReader(std::make_unique<TraceInputStream>(0, false, "-"), path));
  const std::string name = valid_utf8(path);
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (errno == ENOENT) throw TraceError(name + ": cannot open: no such file");
    throw TraceError(fmt::format("{}: cannot open for reading: {}", name, std::strerror(errno)));
  }
  auto in = std::make_unique<TraceInputStream>(fd, true, name);
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) throw TraceError(name + ": is a directory, not a trace");
  return std::unique_ptr<TraceReader>(new TraceReader(std::move(in), path));
}

std::uint64_t TraceReader::bytes_read() const { return in_->raw_bytes(); }

const char* TraceReader::compression() const { return in_->compression(); }

void TraceReader::fail(const std::string& what) const {
  if (last_line_cut_)
    throw TraceCutShort(fmt::format("{}:{}: the last line is cut short (was the process killed while writing?): {}",
                                 source_, line_, what));
  throw TraceError(fmt::format("{}:{}: {}", source_, line_, what));
}

bool TraceReader::read_line(std::string_view& line) {
  for (;;) {
    if (begin_ < end_) {
      const char* s = buf_.data() + begin_;
      if (const void* nl = std::memchr(s, '\n', end_ - begin_)) {
        const auto len = static_cast<std::size_t>(static_cast<const char*>(nl) - s);
        line = std::string_view(s, len);
        begin_ += len + 1;
        ++line_;
        last_line_cut_ = false;
        break;
      }
    }
    if (eof_) {
      if (begin_ == end_) return false;
      line = std::string_view(buf_.data() + begin_, end_ - begin_);
      begin_ = end_;
      ++line_;
      last_line_cut_ = true;
      break;
    }
    // Keep the partial line, make room, read more.
    if (begin_ > 0) {
      std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    if (end_ == buf_.size()) {
      if (buf_.size() >= kMaxLine) {
        ++line_;
        fail(fmt::format("a line longer than {} bytes; not a cupool trace", kMaxLine));
      }
      buf_.resize(buf_.size() * 2);
    }
    const std::size_t got = in_->read(buf_.data() + end_, buf_.size() - end_);
    end_ += got;
    if (got == 0) eof_ = true;
  }
  // Bad UTF-8 becomes U+FFFD here, before any parser sees the line (docs/trace-format.md).
  if (!is_ascii(line) && !is_valid_utf8(line)) {
    fixed_ = valid_utf8(line);
    line = fixed_;
  }
  return true;
}

void TraceReader::read_header() {
  std::string_view line;
  if (!read_line(line)) throw TraceError(fmt::format("{}: the file is empty; not a cupool trace", source_));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::exception&) {
    fail("the first line is not JSON; not a cupool trace");
  }
  if (!j.is_object() || !j.contains("type") || j["type"] != std::string(trace::line::header))
    fail("the first line is not a cupool trace header");
  namespace hk = trace::header_key;
  if (!j.contains(hk::format) || j[hk::format] != std::string(trace::kFormatName))
    fail(fmt::format("not a cupool trace (the header's \"{}\" is not \"{}\")", hk::format, trace::kFormatName));
  const auto version = j.find(hk::version);
  if (version == j.end() || !version->is_string()) fail("header field \"version\": expected a string \"MAJOR.MINOR\"");
  const std::string v = version->get<std::string>();
  int major = 0, minor = 0;
  const auto dot = v.find('.');
  const char* b = v.data();
  const char* e = v.data() + v.size();
  if (dot == std::string::npos || std::from_chars(b, b + dot, major).ptr != b + dot ||
      std::from_chars(b + dot + 1, e, minor).ptr != e || dot == 0 || dot + 1 == v.size())
    fail(fmt::format("header field \"version\": \"{}\" is not \"MAJOR.MINOR\"", v));
  if (major > trace::kFormatMajor)
    throw TraceError(fmt::format("{}: trace format version {} is newer than this cupool understands ({}.x); upgrade cupool",
                                 source_, v, trace::kFormatMajor));
  if (major < trace::kOldestReadMajor)
    throw TraceError(fmt::format("{}: trace format version {} is older than this cupool reads ({}.x to {}.x)", source_,
                                 v, trace::kOldestReadMajor, trace::kFormatMajor));
  try {
    const JsonFields f{j, "header"};
    header_.major = major;
    header_.minor = minor;
    header_.cupool_version = f.str(hk::cupool_version);
    header_.pid = f.i64(hk::pid);
    header_.ppid = f.i64(hk::ppid);
    header_.host = f.str(hk::host);
    const auto& cmdline = f.need(hk::cmdline);
    if (!cmdline.is_array()) throw std::invalid_argument("header field \"cmdline\": expected an array of strings");
    for (const auto& arg : cmdline) {
      if (!arg.is_string()) throw std::invalid_argument("header field \"cmdline\": expected an array of strings");
      header_.cmdline.push_back(arg.get<std::string>());
    }
    header_.start_unix_ns = f.u64(hk::start_unix_ns);
    header_.start_mono_ns = f.u64(hk::start_mono_ns);
    header_.config = f.need(hk::config);
    if (!header_.config.is_object()) throw std::invalid_argument("header field \"config\": expected an object");
    if (const auto d = j.find(hk::devices); d != j.end()) {
      if (!d->is_array()) throw std::invalid_argument("header field \"devices\": expected an array");
      for (const auto& dev : *d) add_device(device_from(dev, "header device"));
    }
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
}

bool TraceReader::next(Event& out) {
  std::string_view line;
  while (read_line(line)) {
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank
    if (footer_) fail("a line after the footer");
    if (parse_line(line, out) == Parsed::event) {
      ++events_read_;
      return true;
    }
  }
  return false;
}

TraceReader::Parsed TraceReader::parse_line(std::string_view line, Event& out) {
  // The writer always starts event lines so; anything else takes the general road.
  static constexpr std::string_view kEventStart = R"({"type":"event",)";
  if (line.substr(0, kEventStart.size()) == kEventStart) {
    return parse_event(line, out) ? Parsed::event : Parsed::skipped;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::exception& e) {
    const std::string what = e.what();
    // valid_utf8: nlohmann quotes the bytes it stopped at, which may end inside a character.
    fail("not valid JSON: " + valid_utf8(what.substr(what.find("] ") == std::string::npos ? 0 : what.find("] ") + 2)));
  }
  if (!j.is_object()) fail("not a JSON object");
  const auto type = j.find("type");
  if (type == j.end()) fail("a line without \"type\"");
  if (!type->is_string()) fail("\"type\": expected a string");
  const std::string& t = type->get_ref<const std::string&>();
  if (t == trace::line::event) {
    return parse_event(line, out) ? Parsed::event : Parsed::skipped;
  }
  parse_other(j, t);
  return Parsed::skipped;
}

void TraceReader::parse_other(const nlohmann::json& j, std::string_view type) {
  try {
    if (type == trace::line::device) {
      add_device(device_from(j, "device line"));
    } else if (type == trace::line::drop) {
      dropped_ += JsonFields{j, "drop line"}.u64(trace::drop_key::count);
    } else if (type == trace::line::footer) {
      const JsonFields f{j, "footer"};
      Footer footer;
      namespace fk = trace::footer_key;
      footer.events = f.u64(fk::events);
      footer.dropped = f.u64(fk::dropped);
      footer.allocs = f.u64(fk::allocs);
      footer.frees = f.u64(fk::frees);
      footer.ooms = f.u64(fk::ooms);
      footer.end_mono_ns = f.u64(fk::end_mono_ns);
      if (j.contains(fk::share_waits)) footer.share_waits = f.u64(fk::share_waits);
      if (j.contains(fk::share_wait_ns)) footer.share_wait_ns = f.u64(fk::share_wait_ns);
      const auto& devices = f.need(fk::devices);
      if (!devices.is_array()) throw std::invalid_argument("footer field \"devices\": expected an array");
      for (const auto& d : devices) {
        footer.devices.push_back(device_from(d, "footer device"));
        add_device(footer.devices.back());
      }
      footer_ = std::move(footer);
    } else if (type == trace::line::stack) {
      add_stack(j);
    } else if (type == trace::line::header) {
      throw std::invalid_argument("a second header line");
    }
    // Any other type comes from a newer minor version: skipped.
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  } catch (const nlohmann::json::exception& e) {
    fail(e.what());
  }
}

std::string frame_name(const StackFrame& f) {
  if (!f.symbol.empty()) return fmt::format("{}+0x{:x}", f.symbol, f.symbol_offset);
  if (!f.module.empty()) {
    const std::size_t slash = f.module.rfind('/');
    return fmt::format("{}+0x{:x}", slash == std::string::npos ? f.module : f.module.substr(slash + 1), f.offset);
  }
  return fmt::format("0x{:x}", f.pc);
}

constexpr std::uint64_t kMaxStackId = 1u << 16;  // trace/stack_table.h: StackTable::kMaxStacks

void TraceReader::add_stack(const nlohmann::json& j) {
  namespace sk = trace::stack_key;
  const JsonFields f{j, "stack line"};
  const std::uint64_t id = f.u64(sk::id);
  // The writer numbers at most StackTable::kMaxStacks stacks; a larger id is no trace of ours.
  if (id == 0 || id > kMaxStackId)
    throw std::invalid_argument(fmt::format("stack line field \"id\": {} is out of range (1 to {})", id, kMaxStackId));
  const auto& frames = f.need(sk::frames);
  if (!frames.is_array()) throw std::invalid_argument("stack line field \"frames\": expected an array");
  auto hex = [](const JsonFields& ff, const char* key) {
    const std::string text = ff.str(key);
    std::uint64_t v = 0;
    if (text.size() < 3 || text[0] != '0' || text[1] != 'x')
      throw std::invalid_argument(fmt::format("{} field \"{}\": expected \"0x...\"", ff.what, key));
    const char* e = text.data() + text.size();
    const auto r = std::from_chars(text.data() + 2, e, v, 16);
    if (r.ec != std::errc() || r.ptr != e)
      throw std::invalid_argument(fmt::format("{} field \"{}\": expected \"0x...\" (64 bits)", ff.what, key));
    return v;
  };
  Stack stack;
  for (const auto& fr : frames) {
    if (!fr.is_object()) throw std::invalid_argument("stack frame: expected an object");
    const JsonFields ff{fr, "stack frame"};
    StackFrame frame;
    frame.pc = hex(ff, sk::pc);
    if (fr.contains(sk::module)) frame.module = valid_utf8(ff.str(sk::module));
    if (fr.contains(sk::offset)) frame.offset = hex(ff, sk::offset);
    if (fr.contains(sk::symbol)) {
      frame.symbol = valid_utf8(ff.str(sk::symbol));
      if (fr.contains(sk::symbol_offset)) frame.symbol_offset = hex(ff, sk::symbol_offset);
    }
    stack.push_back(std::move(frame));
  }
  if (stack.empty()) throw std::invalid_argument("stack line: no frames");
  if (stacks_.size() < id) stacks_.resize(id);
  stacks_[id - 1] = std::move(stack);
}

void TraceReader::add_device(DeviceInfo d) {
  for (DeviceInfo& known : devices_)
    if (known.index == d.index) {
      known = std::move(d);
      return;
    }
  devices_.push_back(std::move(d));
}

bool TraceReader::parse_event(std::string_view line, Event& out) {
  Scanner s(line.data(), line.data() + line.size());
  s.set_start(line.data());
  std::uint32_t seen = 0;
  bool has_pool = false;
  bool unknown_kind = false;
  out.has_stream = false;
  out.stream = 0;
  out.has_flags = false;
  out.recycled = false;
  out.granules = false;
  out.has_handle = false;
  out.handle = out.offset = 0;
  out.flags = 0;
  out.oom_class = trace::OomClass::none;
  out.pool = trace::PoolState{};
  out.dur_ns = 0;
  std::uint64_t timed_for = 1;
  const int known_minor = header_.major == trace::kFormatMajor ? trace::kFormatMinor
                          : header_.major == 2               ? trace::kLastMinorOfMajor2
                                                             : trace::kLastMinorOfMajor1;

  auto bad = [&](std::string_view key, const char* expected) {
    if (!s.ok()) fail(fmt::format("event field \"{}\": {}", key, s.error));
    fail(fmt::format("event field \"{}\": expected {}", key, expected));
  };
  auto u64 = [&](std::string_view key, std::uint64_t& v) {
    if (!s.u64(v)) bad(key, "a non-negative integer");
  };
  auto name = [&](std::string_view key, auto& value, const auto& names) {
    const char* at = s.pos();
    std::string_view text;
    if (s.raw_string(text) && lookup_name(text, names, value)) return;
    s.rewind(at);
    if (!s.string(text, scratch_)) bad(key, "a string");
    if (!lookup_name(text, names, value)) fail(fmt::format("event field \"{}\": unknown value \"{}\"", key, text));
  };

  if (!s.expect('{', "'{'")) fail(s.error);
  if (!s.eat('}')) {
    for (;;) {
      const char* key_at = s.pos();
      std::string_view key;
      Key id = s.raw_string(key) ? key_of(key) : Key::unknown;
      char key_copy[32];
      if (id == Key::unknown) {  // escapes, or a key this version does not know: the careful way
        s.rewind(key_at);
        if (!s.string(key, scratch_)) fail(s.error);
        id = key_of(key);
        // The key's text may live in scratch_, which the value may reuse: keep a copy if so.
        if (key.data() == scratch_.data() && key.size() <= sizeof key_copy) {
          std::memcpy(key_copy, key.data(), key.size());
          key = std::string_view(key_copy, key.size());
        }
      }
      if (!s.expect(':', "':'")) fail(s.error);
      std::uint64_t u = 0;
      std::int64_t i = 0;
      switch (id) {
      case Key::t:
        u64(key, out.t_ns);
        seen |= f_t;
        break;
      case Key::tid:
        u64(key, u);
        if (u > UINT32_MAX) bad(key, "a thread id (32 bits)");
        out.tid = static_cast<std::uint32_t>(u);
        seen |= f_tid;
        break;
      case Key::ev: {
        // A kind from a newer minor version is skipped; in a trace of a version this reader
        // knows, an unknown kind is an error.
        const char* at = s.pos();
        std::string_view text;
        if (header_.minor > known_minor && s.string(text, scratch_) &&
            !lookup_name(text, trace::kEventKindNames, out.kind)) {
          unknown_kind = true;
        } else {
          s.rewind(at);
          name(key, out.kind, trace::kEventKindNames);
        }
        seen |= f_ev;
        break;
      }
      case Key::api: {
        std::string_view text;
        if (!s.string(text, scratch_)) bad(key, "a string");
        out.api.assign(text.data(), text.size());  // reuses the capacity
        seen |= f_api;
        break;
      }
      case Key::path:
        name(key, out.path, trace::kPathNames);
        seen |= f_path;
        break;
      case Key::dev:
        if (!s.i64(i) || i < -1 || i > 1 << 20) bad(key, "a device index (-1 when unknown)");
        out.device = static_cast<int>(i);
        seen |= f_dev;
        break;
      case Key::size:
        u64(key, out.size);
        seen |= f_size;
        break;
      case Key::ptr:
        if (!s.address(out.ptr)) bad(key, "an address \"0x...\"");
        seen |= f_ptr;
        break;
      case Key::stream:
        if (!s.address(out.stream)) bad(key, "a handle \"0x...\"");
        out.has_stream = true;
        break;
      case Key::handle:
        if (!s.address(out.handle)) bad(key, "a handle \"0x...\"");
        out.has_handle = true;
        break;
      case Key::offset:
        u64(key, out.offset);
        break;
      case Key::recycled:
        if (!s.boolean(out.recycled)) bad(key, "true or false");
        break;
      case Key::granules:
        if (!s.boolean(out.granules)) bad(key, "true or false");
        break;
      case Key::stack:
        u64(key, u);
        if (u == 0 || u > kMaxStackId) bad(key, "a stack id (1 to 65536)");
        out.stack = static_cast<std::uint32_t>(u);
        break;
      case Key::flags:
        u64(key, u);
        if (u > UINT32_MAX) bad(key, "stream flags (32 bits)");
        out.flags = static_cast<std::uint32_t>(u);
        out.has_flags = true;
        break;
      case Key::rc:
        if (!s.i64(i) || i < INT32_MIN || i > INT32_MAX) bad(key, "an integer result code");
        out.rc = static_cast<int>(i);
        seen |= f_rc;
        break;
      case Key::dur:
        u64(key, out.dur_ns);
        seen |= f_dur;
        break;
      case Key::timed_for:
        u64(key, timed_for);
        if (timed_for == 0 || timed_for > UINT32_MAX) bad(key, "a call count from 1 (32 bits)");
        break;
      case Key::oom:
        name(key, out.oom_class, trace::kOomClassNames);
        break;
      case Key::reserved:
        u64(key, out.pool.reserved);
        has_pool = true;
        break;
      case Key::in_use:
        u64(key, out.pool.in_use);
        has_pool = true;
        break;
      case Key::largest_free:
        u64(key, out.pool.largest_free);
        has_pool = true;
        break;
      case Key::cached:
        u64(key, out.pool.cached);
        has_pool = true;
        break;
      case Key::quarantined:
        u64(key, out.pool.quarantined);
        has_pool = true;
        break;
      case Key::free_blocks:
        u64(key, u);
        if (u > UINT32_MAX) bad(key, "a block count (32 bits)");
        out.pool.free_blocks = static_cast<std::uint32_t>(u);
        has_pool = true;
        break;
      case Key::type: {
        std::string_view text;
        if (!s.string(text, scratch_) || text != trace::line::event) bad(key, "\"event\"");
        break;
      }
      case Key::unknown:  // a key from a newer minor version
        if (!s.skip_value()) fail(s.error);
        break;
      }
      if (s.eat(',')) continue;
      if (s.eat('}')) break;
      if (!s.ok()) fail(s.error);
      s.expect(',', "',' or '}'");
      fail(s.error);
    }
  }
  if (!s.at_end()) {
    s.set_error(fmt::format("text after the end of the object at column {}", s.column()));
    fail(s.error);
  }
  const std::uint32_t required = kRequired | (header_.major == 1 ? static_cast<std::uint32_t>(f_dur) : 0u);
  if ((seen & required) != required) {
    for (const auto& [bit, key] : kRequiredNames)
      if ((required & bit) && !(seen & bit)) fail(fmt::format("event has no \"{}\"", key));
  }
  if (!(seen & f_dur) && timed_for != 1) fail(fmt::format("event has \"{}\" but no \"{}\"", tk::timed_for, tk::dur));
  out.timed_for = seen & f_dur ? static_cast<std::uint32_t>(timed_for) : 0;
  out.has_pool = has_pool;
  return !unknown_kind;
}

// ---- the recorded configuration -----------------------------------------------------------

namespace {
bool decode_size(const nlohmann::json& v, SizeSpec* out) {
  if (!v.is_object()) return false;
  if (auto b = v.find("bytes"); b != v.end() && b->is_number_unsigned()) {
    *out = SizeSpec{b->get<std::uint64_t>(), 0};
    return true;
  }
  if (auto p = v.find("percent"); p != v.end() && p->is_number() && p->get<double>() > 0) {
    *out = SizeSpec{0, p->get<double>()};
    return true;
  }
  return false;
}

// The inverse of append_limit_json (policy/options.cpp).
bool decode_limit(const nlohmann::json& l, LimitSpec* out) {
  *out = LimitSpec{};
  if (l.is_null()) return true;
  if (!l.is_object()) return false;
  if (auto all = l.find("all"); all != l.end() && !all->is_null()) {
    SizeSpec s;
    if (!decode_size(*all, &s)) return false;
    out->all = s;
  }
  if (auto devices = l.find("devices"); devices != l.end()) {
    if (!devices->is_object()) return false;
    for (const auto& [key, value] : devices->items()) {
      SizeSpec s;
      int device = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), device);
      if (ec != std::errc() || end != key.data() + key.size() || !decode_size(value, &s)) return false;
      out->per_device.emplace_back(device, s);
    }
  }
  return true;
}
}  // namespace

std::optional<Config> decode_config(const nlohmann::json& j, std::string* why) {
  auto fail = [&](const std::string& what) -> std::optional<Config> {
    if (why) *why = "configuration: " + what;
    return std::nullopt;
  };
  if (!j.is_object()) return fail("not an object");
  auto u64 = [&](const char* key, std::uint64_t* out) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_unsigned()) return false;
    *out = it->get<std::uint64_t>();
    return true;
  };
  auto boolean = [&](const char* key, bool* out) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_boolean()) return false;
    *out = it->get<bool>();
    return true;
  };
  auto text = [&](const char* key, std::string* out) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string()) return false;
    *out = it->get<std::string>();
    return true;
  };
  Config c;
  std::string name;
  if (!text("policy", &name)) return fail("no \"policy\"");
  if (auto p = policy_named(name)) c.policy = *p;
  else return fail("unknown policy \"" + name + "\"");
  if (!text("free", &name)) return fail("no \"free\"");
  if (auto m = free_mode_named(name)) c.free_mode = *m;
  else return fail("unknown free mode \"" + name + "\"");
  const auto limit = j.find("limit");
  if (limit == j.end()) return fail("no \"limit\"");
  if (!decode_limit(*limit, &c.limit)) return fail("bad \"limit\"");
  if (auto p = j.find("preallocate"); p == j.end() || !decode_size(*p, &c.preallocate)) return fail("bad \"preallocate\"");
  if (!boolean("preallocate_grow", &c.preallocate_grow)) return fail("bad \"preallocate_grow\"");
  if (!u64("growth_chunk", &c.growth_chunk) || !u64("growth_chunk_max", &c.growth_chunk_max))
    return fail("bad \"growth_chunk\" or \"growth_chunk_max\"");
  if (auto r = j.find("release_idle_ns"); r != j.end() && r->is_number_unsigned()) {
    c.release_idle_ns = r->get<std::uint64_t>();
  } else if (r == j.end() || !r->is_null()) {
    return fail("bad \"release_idle_ns\"");
  }
  // Keys added after format 2.0: absent in older traces, which had these defaults' behaviour.
  if (j.contains("thread_cache") && !boolean("thread_cache", &c.thread_cache)) return fail("bad \"thread_cache\"");
  if (j.contains("vmm_cache") && !boolean("vmm_cache", &c.vmm_cache)) return fail("bad \"vmm_cache\"");
  text("trace", &c.trace_path);
  u64("trace_flush_ns", &c.trace_flush_ns);
  if (std::uint64_t events = 0; u64("trace_buffer_events", &events)) c.trace_buffer_events = static_cast<std::uint32_t>(events);
  if (std::uint64_t n = 0; u64("trace_stacks", &n) && n <= 1'000'000) c.trace_stacks = static_cast<std::uint32_t>(n);  // 3.3 on
  text("log_level", &c.log_level);
  // The shared budget (format 3.0 on): absent before.
  if (j.contains("share")) {
    if (!text("share", &c.share)) return fail("bad \"share\"");
    if (!u64("share_wait_ns", &c.share_wait_ns)) return fail("bad \"share_wait_ns\"");
    std::string access;
    if (!text("share_access", &access) || (access != "user" && access != "group")) return fail("bad \"share_access\"");
    c.share_group = access == "group";
    const auto sl = j.find("share_limit");
    if (sl == j.end()) return fail("no \"share_limit\"");
    if (!decode_limit(*sl, &c.share_limit)) return fail("bad \"share_limit\"");
  }
  return c;
}

}  // namespace cupool
